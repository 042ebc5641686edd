package sink

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrFenced is the error of every record produced after an earlier record of
// the same producer failed: once one batch failed, no later batch may reach
// the broker, or a later event could be delivered before an earlier one of
// the same aggregate.
var ErrFenced = errors.New("produce fenced after an earlier delivery failure")

// fenceError is the error of the records after the one that failed with
// cause: ErrFenced, still carrying the cause, so that a record the broker
// can never take (a RecordError) stops the stream whichever record's
// outcome it hears first, instead of being taken for an outage and replayed.
func fenceError(cause error) error {
	if errors.Is(cause, ErrFenced) || errors.Is(cause, errClosed) {
		return cause
	}
	return fmt.Errorf("%w: %w", ErrFenced, cause)
}

// errClosed is the error of records still waiting when Close gave up.
var errClosed = errors.New("producer closed before the records were acknowledged")

// RecordError is a record the broker cannot take whatever the retries (too
// large for the topic even alone in its batch, a topic that does not exist
// or may not be written). It is bad input, not an outage.
type RecordError struct {
	Topic  string
	Key    []byte // nil when the refusal is not one record's (a batch's)
	Reason string
	Err    error
}

// Error names the topic, never the record's key: it is a row's content
// (its agregat_id), and the error reaches the log and /status.
func (e *RecordError) Error() string {
	if e.Key == nil {
		return fmt.Sprintf("records for topic %q: %s", e.Topic, e.Reason)
	}
	return fmt.Sprintf("a record for topic %q: %s", e.Topic, e.Reason)
}

func (e *RecordError) Unwrap() error { return e.Err }

// Permanent tells the replication stream that no retry or replay can fix
// this: outboxd stops (or, for a Refusable record, dead-letters it).
func (e *RecordError) Permanent() string { return e.Reason }

// AuthError is a connection the broker refuses for good: TLS (an untrusted
// certificate, a wrong server name, a plaintext listener) or SASL (a wrong
// password or mechanism). Like a RecordError, no retry can fix it.
type AuthError struct {
	Reason string
	Err    error
}

func (e *AuthError) Error() string { return e.Reason + " (" + e.Err.Error() + ")" }

func (e *AuthError) Unwrap() error { return e.Err }

// Permanent: see RecordError.
func (e *AuthError) Permanent() string { return e.Reason }

// retriable reports whether a produce error may go away on its own.
func retriable(err error) bool {
	if authFailure(err) != nil {
		return false
	}
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		// REPLICA_NOT_AVAILABLE is stale metadata, retriable for the Java
		// client, though kafka-go does not list it; so is
		// CONCURRENT_TRANSACTIONS: the coordinator still completes the
		// transaction before (transaction.go).
		return kerr.Temporary() || kerr == kafka.ReplicaNotAvailable || kerr == kafka.ConcurrentTransactions
	}
	// Transport errors (a refused or reset connection, a timeout): the
	// outcome is unknown, a retry may duplicate but never reorders.
	return !errors.Is(err, errEncode)
}

var errEncode = errors.New("encode record batch")

// refusedContent reports whether err is the broker refusing a batch for the
// content of its records, which no retry can change: the producer splits
// the batch down to the record (Producer.isolate), whose route's on_error
// then decides.
func refusedContent(err error) bool {
	for _, code := range []kafka.Error{kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidTimestamp, kafka.InvalidRecord} {
		if errors.Is(err, code) {
			return true
		}
	}
	return false
}

// refusalFix is the way out of a record (timestamp ts in ms) that the
// broker refused for its content with err.
func refusalFix(err error, ts int64, now time.Time) string {
	switch {
	case errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge):
		return "raise the topic's max.message.bytes (and the broker's message.max.bytes)"
	case errors.Is(err, kafka.InvalidTimestamp):
		at := time.UnixMilli(ts).UTC()
		off := fmt.Sprintf("%s before", now.Sub(at).Round(time.Second))
		if at.After(now) {
			off = fmt.Sprintf("%s after", at.Sub(now).Round(time.Second))
		}
		return fmt.Sprintf("the record's timestamp %s (%s outboxd's clock) is outside what the topic takes with message.timestamp.type=CreateTime "+
			"(message.timestamp.before.max.ms and message.timestamp.after.max.ms, message.timestamp.difference.max.ms before Kafka 3.6); "+
			"old rows replayed or snapshotted carry their routes[].timestamp column: raise those limits on the topic, set its message.timestamp.type=LogAppendTime, "+
			"or drop routes[].timestamp so that records carry the time they are produced",
			at.Format(time.RFC3339Nano), off)
	case errors.Is(err, kafka.InvalidMessage):
		return "the broker found the record corrupt (CORRUPT_MESSAGE) on every attempt: check what sits between outboxd and the broker (a proxy that rewrites requests), and the broker's log"
	}
	return "see the broker's log for the check it failed (a compacted topic refuses a record without a key)"
}

// permanent names the broker errors that no retry or replay can fix: the
// same records would fail the same way for ever.
func permanent(err error) string {
	if errors.Is(err, errEncode) {
		return "the record batch could not be encoded"
	}
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return ""
	}
	switch kerr {
	case kafka.InvalidRecord, kafka.InvalidMessage:
		return "the broker refused the record as invalid"
	case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed:
		return "not authorized for the topic: grant outboxd's principal DESCRIBE and WRITE on it"
	case kafka.InvalidTopic:
		return "the topic name is invalid"
	}
	if !retriable(err) {
		// As the Java producer: an error the broker does not call retriable
		// fails the send (INVALID_TIMESTAMP, POLICY_VIOLATION, codes kafka-go
		// does not know, ...). Replaying would fail the same way for ever.
		return fmt.Sprintf("the broker refused with a non-retriable error (%v)", err)
	}
	return ""
}

// brokerError is an error code a broker answered for a partition, with the
// message it gave (INVALID_TIMESTAMP's names the range the topic takes).
type brokerError struct {
	code    kafka.Error
	message string
}

func (e *brokerError) Error() string { return e.code.Error() + ": " + e.message }

func (e *brokerError) Unwrap() error { return e.code }

// codeError is the error a broker answered with code and, when it gave
// one, message.
func codeError(code int16, message string) error {
	if message != "" {
		return &brokerError{code: kafka.Error(code), message: message}
	}
	return kafka.Error(code)
}

// codeName is err's Kafka error code as the protocol names it, with the
// broker's message when it gave one.
func codeName(err error) string {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return err.Error()
	}
	name, ok := codeNames[kerr]
	if !ok {
		name = kerr.Title()
	}
	var be *brokerError
	if errors.As(err, &be) && be.message != "" {
		return name + " (" + be.message + ")"
	}
	return name
}

var codeNames = map[kafka.Error]string{
	kafka.InvalidMessage:          "CORRUPT_MESSAGE",
	kafka.UnknownTopicOrPartition: "UNKNOWN_TOPIC_OR_PARTITION",
	kafka.LeaderNotAvailable:      "LEADER_NOT_AVAILABLE",
	kafka.MessageSizeTooLarge:     "MESSAGE_TOO_LARGE",
	kafka.RecordListTooLarge:      "RECORD_LIST_TOO_LARGE",
	kafka.InvalidTimestamp:        "INVALID_TIMESTAMP",
	kafka.InvalidRecord:           "INVALID_RECORD",
}
