package testutil

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Refusal is the JSON body of a dispatcher's data-port refusal.
type Refusal struct {
	Error struct {
		Type              string `json:"type"`
		Message           string `json:"message"`
		Tier              string `json:"tier"`
		QueuePosition     int    `json:"queue_position"`
		RetryAfterSeconds int    `json:"retry_after_seconds"`
	} `json:"error"`
}

// ParseRefusal decodes body as a Refusal and fails t when it is not one,
// or has a field a Refusal does not know.
func ParseRefusal(t testing.TB, body []byte) Refusal {
	t.Helper()
	var r Refusal
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("refusal body %q: %v", body, err)
	}
	return r
}
