"""Reads a topic's CloudEvents with the official CloudEvents SDK.

    python read_cloudevents.py BROKERS TOPIC COUNT

Consumes TOPIC from its beginning with confluent-kafka until COUNT records
are read (or 60 s pass), and parses each with the SDK's Kafka protocol
binding (cloudevents.core.bindings.kafka.from_kafka_event: binary or
structured mode, as the record says), which validates the event. Prints one
JSON line per record: its partition, offset, the event's attributes (as
the SDK read them) and its data; a record the SDK refuses prints
{"error": ...} and makes the exit status 1.
"""

import json
import sys
import time

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event
from confluent_kafka import Consumer


def main():
    brokers, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "outboxd-test-cloudevents-%d" % time.time_ns(),
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    read, failed = 0, False
    deadline = time.monotonic() + 60
    try:
        while read < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise SystemExit("consume: %s" % msg.error())
            read += 1
            headers = {k: v for k, v in (msg.headers() or [])}
            out = {"partition": msg.partition(), "offset": msg.offset()}
            try:
                event = from_kafka_event(KafkaMessage(headers=headers, key=msg.key(), value=msg.value()))
            except Exception as e:  # the SDK refused the record
                out["error"] = "%s: %s" % (type(e).__name__, e)
                failed = True
            else:
                attrs = event.get_attributes()
                out["attributes"] = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in attrs.items()}
                out["data"] = event.get_data()
            print(json.dumps(out), flush=True)
    finally:
        consumer.close()
    if read < count:
        raise SystemExit("read %d of %d records of %s" % (read, count, topic))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
