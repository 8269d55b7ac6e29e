// Package controllers turns ModelPool, ServiceTier and TenantQuota objects,
// plus the model Deployment's ready replicas, into Policy documents and
// pushes them to every dispatcher pod of the pool.
//
// bounds.go is the pure computation (DESIGN.md section 4): no API server, no
// clock, no goroutines; `tiergate simulate` calls it too. The reconcilers
// read objects through controller-runtime's cache, compute status with pure
// helpers and write it only when it changed. The push client sends policies
// concurrently, one goroutine per dispatcher pod for the duration of a push,
// and keeps what each pod acknowledged in memory behind a mutex, keyed by pod
// UID. controller-runtime serialises reconciles of one pool, so one pool's
// push state is only ever changed by one reconcile at a time.
package controllers
