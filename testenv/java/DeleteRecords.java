// DeleteRecords deletes a topic's records below an offset, partition by
// partition, with the Apache Kafka admin client (what kafka-delete-records.sh
// does, and what retention.ms does to a partition segment by segment), and
// prints each partition's new log start offset: <partition> <low watermark>.
// It is how the tests make a partition whose oldest records are gone
// (testenv.DeleteRecords).
//
// java -cp "<kafka lib>/*" DeleteRecords.java <brokers> <topic> <partition>=<offset>...
// An offset of -1 deletes up to the partition's high watermark.
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;

public class DeleteRecords {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        Map<TopicPartition, RecordsToDelete> todo = new HashMap<>();
        for (int i = 2; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            todo.put(new TopicPartition(args[1], Integer.parseInt(kv[0])), RecordsToDelete.beforeOffset(Long.parseLong(kv[1])));
        }
        try (Admin admin = Admin.create(props)) {
            for (Map.Entry<TopicPartition, KafkaFuture<DeletedRecords>> e : admin.deleteRecords(todo).lowWatermarks().entrySet()) {
                System.out.println(e.getKey().partition() + " " + e.getValue().get().lowWatermark());
            }
        }
    }
}
