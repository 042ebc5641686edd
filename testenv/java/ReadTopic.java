// ReadTopic reads a topic from its beginning with the Apache Kafka Java
// consumer, at an isolation level (read_committed: up to each partition's
// last stable offset, without aborted transactions; read_uncommitted: up
// to the high watermark), and prints one line per record:
// <partition> <offset> <id_esdeveniment header>. It is the consumer that
// is not outboxd's, for the transactions tests (testenv.ReadTopic).
//
// java -cp "<kafka lib>/*" ReadTopic.java <brokers> <topic> <isolation level>
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ReadTopic {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("isolation.level", args[2]);
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo p : c.partitionsFor(args[1], Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(p.topic(), p.partition()));
            }
            c.assign(parts);
            c.seekToBeginning(parts);
            Map<TopicPartition, Long> end = c.endOffsets(parts, Duration.ofSeconds(30));
            StringBuilder out = new StringBuilder();
            long deadline = System.currentTimeMillis() + 120_000;
            while (!caughtUp(c, parts, end)) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("not caught up after 120 s");
                }
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    Header h = r.headers().lastHeader("id_esdeveniment");
                    String id = h == null ? "-" : new String(h.value(), StandardCharsets.UTF_8);
                    out.append(r.partition()).append(' ').append(r.offset()).append(' ').append(id).append('\n');
                }
            }
            System.out.print(out);
        }
    }

    static boolean caughtUp(KafkaConsumer<byte[], byte[]> c, List<TopicPartition> parts, Map<TopicPartition, Long> end) {
        for (TopicPartition tp : parts) {
            if (c.position(tp) < end.get(tp)) {
                return false;
            }
        }
        return true;
    }
}
