"""Reads a topic's CloudEvents with the official CloudEvents SDK.

    python read_cloudevents.py BROKERS TOPIC COUNT

Consumes TOPIC from its beginning until COUNT records are read (or 60 s
pass), and parses each with the SDK's Kafka protocol binding
(cloudevents.core.bindings.kafka.from_kafka_event: binary or structured
mode, as the record says), which validates the event. Prints one JSON line
per record: its partition, offset, the event's attributes (as the SDK read
them) and its data; a record the SDK refuses prints {"error": ...} and
makes the exit status 1.
"""

import sys

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event

from topic import each_record


def describe(msg):
    headers = {k: v for k, v in (msg.headers() or [])}
    try:
        event = from_kafka_event(KafkaMessage(headers=headers, key=msg.key(), value=msg.value()))
    except Exception as e:  # the SDK refused the record
        return {"error": "%s: %s" % (type(e).__name__, e)}
    attrs = event.get_attributes()
    return {"attributes": {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in attrs.items()},
            "data": event.get_data()}


if __name__ == "__main__":
    each_record(sys.argv[1], sys.argv[2], int(sys.argv[3]), describe)
