"""Reads a topic's CloudEvents with the official CloudEvents SDK.

    python read_cloudevents.py BROKERS TOPIC COUNT [REGISTRY_URL FORMAT [PROTO_FILE]]

Consumes TOPIC from its beginning until COUNT records are read (or 60 s
pass), and parses each with the SDK's Kafka protocol binding
(cloudevents.core.bindings.kafka.from_kafka_event: binary or structured
mode, as the record says), which validates the event. Prints one JSON line
per record: its partition, offset, the event's attributes (as the SDK read
them) and its data; a record the SDK refuses prints {"error": ...} and
makes the exit status 1.

With REGISTRY_URL and FORMAT the data is in a schema registry's wire
format (binary mode, ce_dataschema naming its schema): the SDK reads the
attributes, and confluent-kafka's deserializer of FORMAT (read_registry.py)
the data.
"""

import sys

from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event

from topic import each_record


def describer(data_of=None):
    def describe(msg):
        headers = {k: v for k, v in (msg.headers() or [])}
        # The SDK reads data as text: wire-format data goes to data_of.
        value = b"" if data_of else msg.value()
        try:
            event = from_kafka_event(KafkaMessage(headers=headers, key=msg.key(), value=value))
            data = data_of(msg) if data_of else event.get_data()
        except Exception as e:  # the SDK or the deserializer refused the record
            return {"error": "%s: %s" % (type(e).__name__, e)}
        attrs = event.get_attributes()
        return {"attributes": {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in attrs.items()},
                "data": data}
    return describe


def main():
    brokers, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data_of = None
    if len(sys.argv) > 4:
        from read_registry import value_deserializer
        data_of = value_deserializer(sys.argv[4], topic, sys.argv[5], sys.argv[6] if len(sys.argv) > 6 else None)
    each_record(brokers, topic, count, describer(data_of))


if __name__ == "__main__":
    main()
