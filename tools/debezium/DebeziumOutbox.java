// DebeziumOutbox runs Debezium's PostgreSQL connector in its embedded
// engine with the outbox EventRouter SMT, and writes each record it emits
// as a Kafka Connect worker would produce it: key and value through the
// configured converters, headers through SimpleHeaderConverter (a worker's
// default). One JSON line per record on stdout:
//
//   {"topic": "...", "key": BASE64|null, "value": BASE64|null,
//    "headers": [["id", BASE64], ...], "timestamp": MS}
//
// It is the reference of outboxd's comparison test
// (integration/debezium_compare_test.go, make test-debezium); it exits after
// the number of records given.
//
// usage: java DebeziumOutbox CONFIG.properties COUNT
//
// CONFIG holds the connector's and the SMT's properties, and
// outboxd.key.converter / outboxd.value.converter: "string" (StringConverter)
// or "json" (JsonConverter, schemas.enable=false).
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import java.io.FileReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;
import org.apache.kafka.connect.storage.StringConverter;

public class DebeziumOutbox {
    static Converter converter(String kind, boolean isKey) {
        Converter c = kind.equals("json") ? new JsonConverter() : new StringConverter();
        c.configure(Map.of("schemas.enable", "false"), isKey);
        return c;
    }

    static String b64(byte[] b) {
        return b == null ? "null" : "\"" + Base64.getEncoder().encodeToString(b) + "\"";
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileReader r = new FileReader(args[0], StandardCharsets.UTF_8)) {
            props.load(r);
        }
        int want = Integer.parseInt(args[1]);
        Converter keys = converter(props.getProperty("outboxd.key.converter", "string"), true);
        Converter values = converter(props.getProperty("outboxd.value.converter", "string"), false);
        props.remove("outboxd.key.converter");
        props.remove("outboxd.value.converter");
        SimpleHeaderConverter headers = new SimpleHeaderConverter();
        headers.configure(Map.of());
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        CountDownLatch done = new CountDownLatch(want);
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(props)
                .notifying(event -> {
                    SourceRecord r = event.record();
                    if (done.getCount() == 0) {
                        return;
                    }
                    StringBuilder line = new StringBuilder("{\"topic\": ").append(quote(r.topic()));
                    line.append(", \"key\": ").append(b64(keys.fromConnectData(r.topic(), r.keySchema(), r.key())));
                    line.append(", \"value\": ").append(b64(values.fromConnectData(r.topic(), r.valueSchema(), r.value())));
                    line.append(", \"headers\": [");
                    String sep = "";
                    for (Header h : r.headers()) {
                        line.append(sep).append("[").append(quote(h.key())).append(", ")
                                .append(b64(headers.fromConnectHeader(r.topic(), h.key(), h.schema(), h.value()))).append("]");
                        sep = ", ";
                    }
                    line.append("], \"timestamp\": ").append(r.timestamp()).append("}");
                    out.println(line);
                    done.countDown();
                })
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("debezium engine stopped: " + message);
                        if (error != null) {
                            error.printStackTrace();
                        }
                        System.exit(1);
                    }
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        done.await();
        engine.close();
        executor.shutdown();
        executor.awaitTermination(30, TimeUnit.SECONDS);
        System.exit(0);
    }
}
