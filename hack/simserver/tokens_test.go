package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseOutputTokens(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    string
		wantErr string
	}{
		"empty is the maximum": {in: "", want: "<nil>"},
		"bare":                 {in: "100", want: "const:100"},
		"const":                {in: "const:7.5", want: "const:7.5"},
		"exp":                  {in: "exp:200", want: "exp:200"},
		"lognormal":            {in: "lognormal:200,150", want: "lognormal:200,150"},
		"negative":             {in: "-3", wantErr: "bad --output-tokens: negative value -3"},
		"not a number":         {in: "many", wantErr: `bad --output-tokens: strconv.ParseFloat: parsing "many": invalid syntax`},
		"lognormal no sd":      {in: "lognormal:5", wantErr: `bad --output-tokens "lognormal:5": lognormal needs MEAN,STDDEV`},
		"unknown kind":         {in: "zipf:2", wantErr: `bad --output-tokens "zipf:2": unknown kind "zipf" (want const, exp or lognormal)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := parseOutputTokens(tc.in, newLockedRand(1))
			if tc.wantErr != "" {
				if !errors.Is(err, errBadCount) || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want errBadCount %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := "<nil>"
			if d != nil {
				got = d.String()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestTokenModelValidate(t *testing.T) {
	tests := map[string]struct {
		m    tokenModel
		want string
	}{
		"ok":               {m: tokenModel{bytesPerToken: 4, prefill: 1000, decode: 50}},
		"zero bytes":       {m: tokenModel{bytesPerToken: 0}, want: "bad token flags: --bytes-per-token must be > 0, got 0"},
		"negative prefill": {m: tokenModel{bytesPerToken: 4, prefill: -1}, want: "bad token flags: --prefill-tokens-per-second must be >= 0, got -1"},
		"negative decode":  {m: tokenModel{bytesPerToken: 4, decode: -2}, want: "bad token flags: --decode-tokens-per-second must be >= 0, got -2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.m.validate()
			got := ""
			if err != nil {
				got = err.Error()
				if !errors.Is(err, errBadTokens) {
					t.Errorf("err %v is not errBadTokens", err)
				}
			}
			if got != tc.want {
				t.Errorf("err %q, want %q", got, tc.want)
			}
		})
	}
}

// The command refuses bad token flags with exit code 2 and says why.
func TestRunRefusesBadTokenFlags(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"bytes per token": {args: []string{"--bytes-per-token", "0"}, want: "--bytes-per-token must be > 0, got 0"},
		"output tokens":   {args: []string{"--output-tokens", "exp:x"}, want: "bad --output-tokens"},
		"decode rate":     {args: []string{"--decode-tokens-per-second", "-5"}, want: "--decode-tokens-per-second must be >= 0, got -5"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(append([]string{"--listen", "127.0.0.1:0"}, tc.args...), &stderr); code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tc.want)
			}
		})
	}
}

func TestPromptTokens(t *testing.T) {
	m := tokenModel{bytesPerToken: 4}
	tests := map[string]struct {
		body    string
		want    int
		wantErr string
	}{
		"chat strings":       {body: `{"messages":[{"role":"system","content":"12345678"},{"role":"user","content":"123"}]}`, want: 3},
		"chat parts":         {body: `{"messages":[{"role":"user","content":[{"type":"text","text":"12345678"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, want: 2},
		"chat null content":  {body: `{"messages":[{"role":"assistant","content":null}]}`, want: 0},
		"prompt string":      {body: `{"prompt":"123456789"}`, want: 3},
		"prompt strings":     {body: `{"prompt":["1234","12345678"]}`, want: 3},
		"prompt token IDs":   {body: `{"prompt":[1,2,3,4,5]}`, want: 5},
		"prompt ID lists":    {body: `{"prompt":[[1,2],[3]]}`, want: 3},
		"no prompt":          {body: `{}`, want: 0},
		"bad chat content":   {body: `{"messages":[{"content":5}]}`, wantErr: "messages[0].content: not a string or a list of parts"},
		"bad prompt":         {body: `{"prompt":{"a":1}}`, wantErr: "prompt is not a string, a list of strings or a list of token IDs"},
		"prompt bare number": {body: `{"prompt":5}`, wantErr: "prompt is not a string, a list of strings or a list of token IDs"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var req request
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			size, err := sizeOf(req.Messages, req.Prompt)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.promptTokens(size); got != tc.want {
				t.Errorf("prompt tokens %d, want %d", got, tc.want)
			}
		})
	}
}

func TestTokenTiming(t *testing.T) {
	tests := map[string]struct {
		m           tokenModel
		prompt      int
		first, each time.Duration
	}{
		"both":         {m: tokenModel{prefill: 1000, decode: 50}, prompt: 100, first: 120 * time.Millisecond, each: 20 * time.Millisecond},
		"prefill only": {m: tokenModel{prefill: 1000}, prompt: 250, first: 250 * time.Millisecond},
		"decode only":  {m: tokenModel{decode: 4}, prompt: 1e6, first: 250 * time.Millisecond, each: 250 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			first, each := tc.m.timing(tc.prompt)
			if first != tc.first || each != tc.each {
				t.Errorf("timing = %v, %v; want %v, %v", first, each, tc.first, tc.each)
			}
		})
	}
}

// newTokenServer is newTestServer with a token model.
func newTokenServer(t *testing.T, dist string, m tokenModel) (*server, string) {
	t.Helper()
	s, ts := newTestServer(t, 2, dist)
	s.tok = m
	return s, ts.URL
}

// answer is the parts of a JSON answer the token tests read.
type answer struct {
	Object  string `json:"object"`
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Data  []json.RawMessage `json:"data"`
	Usage usage             `json:"usage"`
}

func postJSON(t *testing.T, url, tenant, body string) (int, answer) {
	t.Helper()
	resp, err := post(context.Background(), t, url, tenant, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a answer
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("answer %q: %v", b, err)
	}
	return resp.StatusCode, a
}

// Every JSON answer reports usage: the prompt by --bytes-per-token, the
// completion per choice times n; embeddings report the input's tokens.
func TestUsageInAnswers(t *testing.T) {
	s, url := newTokenServer(t, "0", tokenModel{bytesPerToken: 2})
	tests := map[string]struct {
		path, body string
		want       usage
		choices    int
	}{
		"chat":           {path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"1234567"}],"max_tokens":3}`, want: newUsage(4, 3), choices: 1},
		"completion n=3": {path: "/v1/completions", body: `{"prompt":"12345678","max_completion_tokens":2,"n":3}`, want: newUsage(4, 6), choices: 3},
		"default max":    {path: "/v1/completions", body: `{"prompt":[1,2,3]}`, want: newUsage(3, 4), choices: 1},
		"embeddings":     {path: "/v1/embeddings", body: `{"input":["1234","12"]}`, want: usage{PromptTokens: 3, TotalTokens: 3}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, a := postJSON(t, url+tc.path, "u", tc.body)
			if code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			if diff := cmp.Diff(tc.want, a.Usage); diff != "" {
				t.Errorf("usage (-want +got)\n%s", diff)
			}
			if len(a.Choices) != tc.choices {
				t.Errorf("%d choices, want %d", len(a.Choices), tc.choices)
			}
		})
	}
	code, a := postJSON(t, url+"/v1/embeddings", "u", `{"input":["a","b"]}`)
	if code != http.StatusOK || len(a.Data) != 2 {
		t.Errorf("embeddings of two inputs: status %d, %d vectors", code, len(a.Data))
	}
	st := s.stats.snapshot().Tenants["u"]
	if st.PromptTokens != 4+4+3+3+1 || st.CompletionTokens != 3+6+4 {
		t.Errorf("tenant tokens prompt %d completion %d, want 15 and 13", st.PromptTokens, st.CompletionTokens)
	}
}

// Bad n, prompts and inputs are refused with 400 and the reason.
func TestTokenRefusals(t *testing.T) {
	_, url := newTokenServer(t, "0", tokenModel{bytesPerToken: 4})
	tests := map[string]struct{ path, body, want string }{
		"n zero":      {path: "/v1/completions", body: `{"n":0}`, want: "n must be between 1 and 16, got 0"},
		"n too many":  {path: "/v1/chat/completions", body: `{"n":17}`, want: "n must be between 1 and 16, got 17"},
		"bad prompt":  {path: "/v1/completions", body: `{"prompt":true}`, want: "bad prompt: prompt is not a string, a list of strings or a list of token IDs"},
		"no input":    {path: "/v1/embeddings", body: `{}`, want: "input is required"},
		"bad input":   {path: "/v1/embeddings", body: `{"input":{"x":1}}`, want: "bad input: prompt is not a string, a list of strings or a list of token IDs"},
		"bad content": {path: "/v1/chat/completions", body: `{"messages":[{"content":{}}]}`, want: "bad prompt: messages[0].content: not a string or a list of parts"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, err := post(context.Background(), t, url+tc.path, "u", tc.body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Message != tc.want {
				t.Errorf("got %d %+v, want 400 invalid_request_error %q", resp.StatusCode, e.Error, tc.want)
			}
		})
	}
}

// streamEvents reads an SSE answer into its data payloads.
func streamEvents(t *testing.T, url, body string) []string {
	t.Helper()
	resp, err := post(context.Background(), t, url, "s", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		}
	}
	return events
}

// A stream carries usage in a last chunk with no choices only when the
// request asks for it; the other chunks then say "usage": null.
func TestStreamUsage(t *testing.T) {
	_, url := newTokenServer(t, "0", tokenModel{bytesPerToken: 4})
	with := streamEvents(t, url+"/v1/chat/completions", `{"stream":true,"max_tokens":2,"stream_options":{"include_usage":true},"messages":[{"content":"12345678"}]}`)
	// two tokens, the finish chunk, the usage chunk, [DONE]
	if len(with) != 5 || with[4] != "[DONE]" {
		t.Fatalf("events %q", with)
	}
	var last struct {
		Choices []any  `json:"choices"`
		Usage   *usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(with[3]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Usage == nil || *last.Usage != newUsage(2, 2) || len(last.Choices) != 0 {
		t.Errorf("usage chunk %s, want no choices and usage 2+2", with[3])
	}
	for _, ev := range with[:3] {
		if !strings.Contains(ev, `"usage":null`) {
			t.Errorf("chunk %s lacks usage: null", ev)
		}
	}
	without := streamEvents(t, url+"/v1/completions", `{"stream":true,"max_tokens":2,"prompt":"x"}`)
	if len(without) != 4 || strings.Contains(strings.Join(without, ""), "usage") {
		t.Errorf("events without include_usage %q", without)
	}
}

// --output-tokens draws an answer's length; a draw above the request's
// maximum is cut there and ends in "length".
func TestOutputTokensDrawn(t *testing.T) {
	tests := map[string]struct {
		dist, body string
		tokens     int
		finish     string
	}{
		"below the maximum": {dist: "const:3", body: `{"max_tokens":10}`, tokens: 3, finish: "stop"},
		"cut at maximum":    {dist: "const:30", body: `{"max_tokens":10}`, tokens: 10, finish: "length"},
		"zero":              {dist: "0", body: `{"max_tokens":10}`, tokens: 0, finish: "stop"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := parseOutputTokens(tc.dist, newLockedRand(1))
			if err != nil {
				t.Fatal(err)
			}
			_, url := newTokenServer(t, "0", tokenModel{bytesPerToken: 4, output: out})
			code, a := postJSON(t, url+"/v1/completions", "u", tc.body)
			if code != http.StatusOK || a.Usage.CompletionTokens != tc.tokens || a.Choices[0].FinishReason != tc.finish {
				t.Errorf("status %d, %d tokens, finish %q; want %d tokens, %q", code, a.Usage.CompletionTokens, a.Choices[0].FinishReason, tc.tokens, tc.finish)
			}
			if got := strings.Count(a.Choices[0].Text, "tok"); got != tc.tokens {
				t.Errorf("text has %d tokens, want %d", got, tc.tokens)
			}
		})
	}
}

// With token rates the service time is prompt/prefill + output/decode: the
// first event comes no sooner than the prefill plus one decode step, and
// the answer no sooner than the whole. (Lower bounds only: a loaded machine
// may be late, never early.)
func TestTokenRatesPaceTheStream(t *testing.T) {
	// 400 bytes = 100 tokens at 1,000/s: 100 ms; 4 tokens at 40/s: 25 ms each.
	_, url := newTokenServer(t, "const:0", tokenModel{bytesPerToken: 4, prefill: 1000, decode: 40})
	body := `{"stream":true,"max_tokens":4,"prompt":"` + strings.Repeat("x", 400) + `"}`
	start := time.Now()
	resp, err := post(context.Background(), t, url+"/v1/completions", "p", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var first, end time.Duration
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") && first == 0 {
			first = time.Since(start)
		}
	}
	end = time.Since(start)
	if first < 125*time.Millisecond || end < 200*time.Millisecond {
		t.Errorf("first event after %v (want >= 125ms), end after %v (want >= 200ms)", first, end)
	}
}
