// Package budget is the dispatcher's memory budget for request bodies
// (--max-queued-bytes): a number of bytes that concurrent requests charge
// as their bodies arrive and give back when they leave the queue. An
// admission whose body would not fit is refused (503 "overloaded", mapped
// by dispatcher/apierror), so the bodies a dispatcher holds never exceed
// the budget, whatever the clients declare or send.
//
// It also derives the default budget from the memory limits the process
// knows of: GOMEMLIMIT, the container's limit passed by the chart, and the
// limit of the process's cgroup (v2 memory.max, v1
// memory.limit_in_bytes). The cgroup files are read through an fs.FS, so
// the parsing is tested on fixtures.
//
// The package is pure accounting: no HTTP, no clock.
//
// Concurrency model: a Budget is one atomic counter, safe for concurrent
// use; a charge never takes the counter past the limit (compare and
// swap). A Charge is one request's share and belongs to the goroutine
// serving that request; Release gives its bytes back exactly once, however
// often it is called.
package budget
