// Package controllers turns ModelPool, ServiceTier and TenantQuota objects,
// plus the model Deployment's ready replicas, into Policy documents and
// pushes them to every dispatcher pod of the pool. The bounds themselves
// come from the capacity package, which `tiergate simulate` shares.
//
//   - PoolReconciler (one reconcile per ModelPool) reads through the
//     manager's cache (observe.go), computes the bounds, stores a new
//     block of policy versions in status before the first of them is
//     pushed (reserve.go), hands the policies to the Pusher, then hands a settled pool's tier statuses
//     to a per-pool latest-wins writer (latestwrite.go) and the quota
//     statuses, with a moving pool's tier statuses, to the status worker,
//     which writes them once the change is over, at its own pace
//     (statusbatch.go, statuspace.go), only where they changed
//     (statuswrite.go); any other pool status change (a version within
//     the block included) is written after the push, up to StatusDelay
//     later, so the pool's next event does not queue behind its write. QuotaReconciler writes only the status of quotas whose
//     tier is gone.
//   - status.go holds pure helpers from observations to status; measured.go
//     and apikeys.go are pure too. The desired replicas come from the
//     dispatchers' acks through capacity.DesiredReplicas; acks come only
//     with pushes, so while a pool is held at zero its resync period is at
//     most heldResyncPeriod (heldresync.go) and a held request reaches
//     desiredReplicas within seconds.
//   - autoscaler.go keeps the KEDA ScaledObject of a pool with
//     spec.autoscaling, built as unstructured so KEDA's module stays out of
//     the build. It reads the ScaledObject only when the pool's spec
//     changed or a resync period passed, and turns every failure (KEDA not
//     installed included) into the AutoscalerUnavailable condition, never
//     into an error of the reconcile.
//   - auth.go reads a JWT pool's JWKS from its labelled Secret or ConfigMap
//     and sets the TenantHeaderUnprotected and JWKSReady conditions;
//     JWKSFetcher (jwksfetch.go) fetches JWKS URLs on their refresh
//     interval, after failures and when a dispatcher's ack names a key ID
//     the set lacks, at most once per MinRefetch, and notifies the pool.
//   - Pusher (push.go, pushqueue.go, pushhttp.go) queues a (pool, pod) key
//     on client-go's rate-limited workqueue, the one controller-runtime
//     uses, whenever the pod needs a push; a bounded number of workers push
//     each key's newest target with a timeout (one PUT, classified in
//     pushhttp.go), a failed key comes back after its own exponential
//     backoff, and each attempt is reported through a non-blocking notifier
//     that enqueues the pool again. The queue's workqueue_* metrics carry
//     name="push".
//   - config.go is the one place of the controllers' defaults and
//     validation (Config, DefaultConfig); the Pusher's and the JWKS
//     fetcher's options are derived from it.
//
// Concurrency: controller-runtime serialises reconciles of one pool, so a
// pool's in-memory state (content hash, version, last resync) is only
// touched by one reconcile at a time; the map holding it, and the Pusher's
// per-key state, are guarded by mutexes; the workqueue never hands one key
// to two workers at once. The tier status writer runs one goroutine per
// pool with a batch to write, its pending batches under a mutex; the
// status worker is one goroutine, its pending batches under a mutex, its
// pacer shared by the writes it runs in parallel. Pusher,
// notifier and JWKSFetcher are manager runnables that need leader election, so only the
// leader pushes and fetches; the fetcher's per-pool state is guarded by its
// mutex and each fetch runs in its own goroutine.
package controllers
