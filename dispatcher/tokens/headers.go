package tokens

import (
	"strconv"
	"time"
)

// OpenAI's rate-limit headers, on every answer to a tenant with a budget.
const (
	HeaderLimitRequests     = "x-ratelimit-limit-requests"
	HeaderRemainingRequests = "x-ratelimit-remaining-requests"
	HeaderResetRequests     = "x-ratelimit-reset-requests"
	HeaderLimitTokens       = "x-ratelimit-limit-tokens"
	HeaderRemainingTokens   = "x-ratelimit-remaining-tokens"
	HeaderResetTokens       = "x-ratelimit-reset-tokens"
)

// Headers are the x-ratelimit-* names and values of d, three for each
// budget the tenant has (Limit > 0), requests first; none without a
// budget. A reset is a Go duration rounded to the millisecond, as OpenAI
// writes it: "1.5s", "6m0s", "20ms", "0s".
func Headers(d Decision) [][2]string {
	var h [][2]string
	if d.Requests.Limit > 0 {
		h = append(h,
			[2]string{HeaderLimitRequests, strconv.FormatInt(d.Requests.Limit, 10)},
			[2]string{HeaderRemainingRequests, strconv.FormatInt(d.Requests.Remaining, 10)},
			[2]string{HeaderResetRequests, resetString(d.Requests.Reset)})
	}
	if d.Tokens.Limit > 0 {
		h = append(h,
			[2]string{HeaderLimitTokens, strconv.FormatInt(d.Tokens.Limit, 10)},
			[2]string{HeaderRemainingTokens, strconv.FormatInt(d.Tokens.Remaining, 10)},
			[2]string{HeaderResetTokens, resetString(d.Tokens.Reset)})
	}
	return h
}

func resetString(d time.Duration) string {
	return max(d, 0).Round(time.Millisecond).String()
}
