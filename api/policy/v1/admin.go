package v1

import (
	"errors"
	"fmt"
)

// AdminErrorType is the "type" of an admin API error.
type AdminErrorType string

// Admin API error types, by the status they come with.
const (
	AdminUnauthenticated AdminErrorType = "unauthenticated" // 401: no or wrong bearer token
	AdminInvalidPolicy   AdminErrorType = "invalid_policy"  // 400: the previous policy stays
	// AdminUnsupportedSchema (400): the policy's schemaVersion is newer
	// than the dispatcher's (SchemaHeader); the previous policy stays.
	AdminUnsupportedSchema AdminErrorType = "unsupported_schema"
	AdminStaleVersion      AdminErrorType = "stale_version"  // 409: older than the applied version
	AdminPoolMismatch      AdminErrorType = "pool_mismatch"  // 409: for another pool than the one held
	AdminBodyTooLarge      AdminErrorType = "body_too_large" // 413
	AdminNoPolicy          AdminErrorType = "no_policy"      // 404: GET before the first policy
	AdminInternal          AdminErrorType = "internal"       // 500
)

// AdminErrorBody is the body of every admin API error: what the admin
// port (dispatcher/admin) sends and what the controller's push client
// reads. Its JSON names are part of the admin API; scripts read them too.
type AdminErrorBody struct {
	Error AdminErrorDetail `json:"error"`
}

// AdminErrorDetail is the inner object of AdminErrorBody.
type AdminErrorDetail struct {
	Type    AdminErrorType `json:"type"`
	Message string         `json:"message"`
	// Errors lists every violation of an invalid policy (invalid_policy).
	Errors []FieldError `json:"errors,omitempty"`
	// CurrentVersion is the version the dispatcher holds (stale_version).
	CurrentVersion *int64 `json:"current_version,omitempty"`
	// CurrentPool is the pool the dispatcher holds (pool_mismatch).
	CurrentPool string `json:"current_pool,omitempty"`
}

// ErrPoolMismatch is wrapped by a *PoolMismatchError; the admin API
// answers it with 409 pool_mismatch.
var ErrPoolMismatch = errors.New("policy: pool mismatch")

// PoolMismatchError refuses a policy for another pool than the one a
// dispatcher holds: a dispatcher serves one pool for its whole life, so
// two ModelPools that select the same dispatcher pod see their pushes
// refused instead of replacing each other's policy.
type PoolMismatchError struct {
	Held, Pushed string
}

func (e *PoolMismatchError) Error() string {
	return fmt.Sprintf("this dispatcher holds the policy of pool %q and refuses one for pool %q: a dispatcher serves one pool until it restarts (do two ModelPools select the same dispatcher pods?)", e.Held, e.Pushed)
}

func (e *PoolMismatchError) Unwrap() error { return ErrPoolMismatch }

// CheckPool returns a *PoolMismatchError when a dispatcher holding a
// policy of pool held is given one of pool next; held "" (no policy yet)
// accepts any pool.
func CheckPool(held, next string) error {
	if held != "" && held != next {
		return &PoolMismatchError{Held: held, Pushed: next}
	}
	return nil
}
