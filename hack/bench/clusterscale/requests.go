package clusterscale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// Requests counts API requests: reads (get, list, watch; GET) and writes
// (everything else), and the writes by verb and resource.
type Requests struct {
	Reads, Writes int
	// WritesBy counts writes keyed "verb resource[/subresource]".
	WritesBy map[string]int `json:",omitempty"`
}

// isRead reports whether an audit verb only reads.
func isRead(verb string) bool { return verb == "get" || verb == "list" || verb == "watch" }

// restMethod finds the method label in a key of testutil.Scrape's.
var restMethod = regexp.MustCompile(`method="([A-Z]+)"`)

// RESTClientRequests are the reads (GET) and writes (any other method)
// that client-go's rest_client_requests_total counted in a scrape keyed
// as testutil.Scrape keys it.
func RESTClientRequests(scrape map[string]float64) (reads, writes int) {
	for k, v := range scrape {
		if !strings.HasPrefix(k, "rest_client_requests_total{") {
			continue
		}
		m := restMethod.FindStringSubmatch(k)
		if m == nil {
			continue
		}
		if m[1] == "GET" {
			reads += int(v)
		} else {
			writes += int(v)
		}
	}
	return reads, writes
}

// AuditEvent is one request of the audit log.
type AuditEvent struct {
	At       time.Time
	User     string
	Verb     string
	Resource string // resource, or resource/subresource
	Code     int
}

// ParseAudit reads a kube-apiserver JSON audit log, one event per request
// (the first stage logged of each audit ID, so a watch counts when it
// starts).
func ParseAudit(r io.Reader) ([]AuditEvent, error) {
	seen := map[string]bool{}
	var out []AuditEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for n := 1; sc.Scan(); n++ {
		var e struct {
			AuditID string `json:"auditID"`
			Verb    string `json:"verb"`
			User    struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			RequestReceived time.Time `json:"requestReceivedTimestamp"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit line %d: %w", n, err)
		}
		if seen[e.AuditID] {
			continue
		}
		seen[e.AuditID] = true
		ev := AuditEvent{At: e.RequestReceived, User: e.User.Username, Verb: e.Verb, Resource: "(non-resource)"}
		if e.ObjectRef != nil {
			ev.Resource = e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				ev.Resource += "/" + e.ObjectRef.Subresource
			}
		}
		if e.ResponseStatus != nil {
			ev.Code = e.ResponseStatus.Code
		}
		out = append(out, ev)
	}
	return out, sc.Err()
}

// CountRequests counts user's events received in [from, to).
func CountRequests(evs []AuditEvent, user string, from, to time.Time) Requests {
	r := Requests{WritesBy: map[string]int{}}
	for _, e := range evs {
		if e.User != user || e.At.Before(from) || !e.At.Before(to) {
			continue
		}
		if isRead(e.Verb) {
			r.Reads++
			continue
		}
		r.Writes++
		r.WritesBy[e.Verb+" "+e.Resource]++
	}
	return r
}
