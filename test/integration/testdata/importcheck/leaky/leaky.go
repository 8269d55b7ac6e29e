// Package leaky imports net/http directly; hack/check-imports.sh must refuse it.
package leaky

import "net/http"

// Client is here only to use the import.
var Client = http.DefaultClient
