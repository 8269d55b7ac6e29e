// Package indirect reaches net/http only through leaky; the check follows
// the whole dependency closure, so it must refuse this one too.
package indirect

import "github.com/tiergate/tiergate/test/integration/testdata/importcheck/leaky"

// Client is here only to use the import.
var Client = leaky.Client
