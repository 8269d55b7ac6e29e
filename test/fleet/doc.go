// Package fleet holds the process-level tests of fleet mode (docs/fleet.md
// and docs/architecture.md#fleet-mode): real `tiergate dispatcher` processes sharing caps
// through a real redis-server, in front of a real simserver (the stand-in
// for vLLM), driven by real HTTP clients.
//
// TestMain builds the tiergate and simserver binaries once. Every test
// starts its own redis-server, simserver and dispatchers on free loopback
// ports and stops them all. Load loops are bounded in count and time.
package fleet
