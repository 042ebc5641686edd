"""Reads a topic written in the Schema Registry wire format with
confluent-kafka's own deserializer.

    python read_registry.py BROKERS REGISTRY_URL TOPIC COUNT FORMAT

Consumes TOPIC from its beginning until COUNT records are read (or 60 s
pass) and deserializes each value with confluent_kafka's JSONDeserializer
(FORMAT json_schema) or AvroDeserializer (avro), which read the schema id
after the magic byte, fetch that schema from the registry and validate (or
decode) the value by it. Prints one JSON line per
record: its partition, offset, schema id and value; a record the
deserializer refuses prints {"error": ...} and makes the exit status 1.
"""

import struct
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from topic import each_record


def main():
    brokers, registry, topic, count, fmt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    client = SchemaRegistryClient({"url": registry})
    if fmt == "avro":
        deserialize = AvroDeserializer(client)
    else:
        deserialize = JSONDeserializer(None, schema_registry_client=client)

    def describe(msg):
        raw = msg.value() or b""
        out = {"schema_id": struct.unpack(">I", raw[1:5])[0] if len(raw) >= 5 else None}
        try:
            out["value"] = deserialize(raw, SerializationContext(topic, MessageField.VALUE))
        except Exception as e:  # the deserializer refused the record
            out["error"] = "%s: %s" % (type(e).__name__, e)
        return out

    each_record(brokers, topic, count, describe)


if __name__ == "__main__":
    main()
