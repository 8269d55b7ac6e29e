// Package dispatcher holds the process-level tests of `tiergate dispatcher`:
// TestMain builds the tiergate binary and hack/simserver, and each test runs
// them as real processes on 127.0.0.1 ports and talks to them over real
// HTTP, including with the openai-go client.
package dispatcher
