package policy

// AdminErrorType is the "type" of an admin API error.
type AdminErrorType string

// Admin API error types, by the status they come with.
const (
	AdminUnauthenticated AdminErrorType = "unauthenticated" // 401: no or wrong bearer token
	AdminInvalidPolicy   AdminErrorType = "invalid_policy"  // 400: the previous policy stays
	AdminStaleVersion    AdminErrorType = "stale_version"   // 409: older than the applied version
	AdminBodyTooLarge    AdminErrorType = "body_too_large"  // 413
	AdminNoPolicy        AdminErrorType = "no_policy"       // 404: GET before the first policy
	AdminInternal        AdminErrorType = "internal"        // 500
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
}
