"""Reads a topic from its beginning, for the consumers of testenv/python."""

import json
import sys
import time

from confluent_kafka import Consumer


def each_record(brokers, topic, count, describe):
    """Consumes topic from its beginning until count records are read (or
    60 s pass), printing one JSON line per record: its partition and
    offset, and what describe(msg) returns (a dict; an "error" member marks
    a record the consumer refused). Exits 1 when one was refused."""
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": "outboxd-test-%s-%d" % (topic, time.time_ns()),
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
            out = {"partition": msg.partition(), "offset": msg.offset()}
            out.update(describe(msg))
            failed = failed or "error" in out
            print(json.dumps(out), flush=True)
    finally:
        consumer.close()
    if read < count:
        raise SystemExit("read %d of %d records of %s" % (read, count, topic))
    sys.exit(1 if failed else 0)
