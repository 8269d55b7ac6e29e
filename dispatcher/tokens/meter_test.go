package tokens

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// used is Meter.Used's answer.
type used struct {
	Prompt, Completion int64
	FromUsage          bool
}

func chatChunk(delta string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
		delta + `,"logprobs":null,"finish_reason":null}]}`
}

func usageChunk(prompt, completion int64) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],`+
		`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`, prompt, prompt+completion, completion)
}

// sse is events as a server writes them: "data: ..." and a blank line.
func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}

// meterUsed writes body to a fresh meter in the pieces splits gives and
// returns its Used.
func meterUsed(contentType string, caps meterCaps, body []byte, c Cost, split func(n int) int) used {
	m := newMeterCaps(contentType, caps)
	for len(body) > 0 {
		n := min(max(split(len(body)), 1), len(body))
		_, _ = m.Write(body[:n])
		body = body[n:]
	}
	p, cp, u := m.Used(c)
	return used{p, cp, u}
}

// checkSplits checks that body gives want whether written whole, one byte
// at a time or in random pieces.
func checkSplits(t *testing.T, rng *rand.Rand, contentType string, caps meterCaps, body string, c Cost, want used) {
	t.Helper()
	splits := map[string]func(int) int{
		"whole":       func(n int) int { return n },
		"byte a time": func(int) int { return 1 },
		"random":      func(n int) int { return 1 + rng.IntN(min(n, 64)) },
	}
	for name, split := range splits {
		got := meterUsed(contentType, caps, []byte(body), c, split)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: Used (-want +got):\n%s", name, diff)
		}
	}
}

func TestMeterStream(t *testing.T) {
	rng := testSeed(t)
	cost := Cost{Prompt: 40, Output: 100, Shape: Chat, Stream: true}
	hi, there := chatChunk(`{"content":"Hi"}`), chatChunk(`{"content":" there"}`)
	role := chatChunk(`{"role":"assistant","content":""}`)
	finish := `{"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}`
	small := meterCaps{json: 1 << 10, tail: 256, line: 300}
	tests := []struct {
		name, body string
		caps       meterCaps
		want       used
	}{
		{
			name: "usage in the last chunk",
			body: sse(role, hi, there, finish, usageChunk(12, 3), "[DONE]"),
			want: used{12, 3, true},
		},
		{
			name: "no usage: the prompt estimate and the content chunks",
			body: sse(role, hi, there, finish, "[DONE]"),
			want: used{40, 2, false},
		},
		{
			name: "usage on every chunk (continuous usage): the last",
			body: sse(
				`{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":12,"completion_tokens":1}}`,
				`{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":12,"completion_tokens":2}}`,
				`{"choices":[{"delta":{"content":""}}],"usage":null}`,
				"[DONE]"),
			want: used{12, 2, true},
		},
		{
			name: "reasoning, tool calls and completions' text count",
			body: sse(
				chatChunk(`{"reasoning_content":"hmm"}`),
				chatChunk(`{"reasoning":"so"}`),
				chatChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}`),
				`{"choices":[{"index":0,"text":"once","finish_reason":null}]}`,
				`{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`),
			want: used{40, 4, false},
		},
		{
			name: "one token per choice with text",
			body: sse(`{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}},{"index":2,"delta":{}}]}`),
			want: used{40, 2, false},
		},
		{
			name: "a content that is not a string is no text",
			body: sse(chatChunk(`{"content":7}`), chatChunk(`{"content":null}`), chatChunk(`{"content":["x"]}`)),
			want: used{40, 0, false},
		},
		{
			name: "CRLF and CR line endings, comments, other fields, no space after data:",
			body: ": ping\r\n\r\nevent: message\r\nid: 1\r\ndata:" + hi + "\r\n\r\n" +
				"retry: 10\rdata: " + there + "\r\r" + "data: " + usageChunk(5, 2) + "\r\n\r\n",
			want: used{5, 2, true},
		},
		{
			name: "CRLF inside an event of two data lines",
			body: "data: {\"choices\":\r\ndata: [{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n",
			want: used{40, 1, false},
		},
		{
			name: "an event's data lines join",
			body: "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n",
			want: used{40, 1, false},
		},
		{
			name: "an event not ended by a blank line is not dispatched",
			body: sse(hi) + "data: " + there + "\n",
			want: used{40, 1, false},
		},
		{
			name: "events that are not JSON objects, and errors",
			body: sse("hello", "[1,2]", `{"error":{"message":"boom"}}`, `{"choices":[{"delta":{"content":"a"}}]`) +
				"event: error\ndata: {\"object\":\"error\"}\n\n",
			want: used{40, 0, false},
		},
		{
			name: "negative usage counts read as 0",
			body: sse(`{"choices":[],"usage":{"prompt_tokens":-4,"completion_tokens":-1}}`),
			want: used{0, 0, true},
		},
		{
			name: "a usage field of the wrong type reads as 0, the rest counts",
			body: sse(`{"choices":[],"usage":{"prompt_tokens":"many","completion_tokens":3}}`),
			want: used{0, 3, true},
		},
		{
			name: "a line over the cap is skipped, the stream goes on",
			caps: small,
			body: sse(hi, `{"choices":[{"delta":{"content":"`+strings.Repeat("y", 400)+`"}}]}`, there),
			want: used{40, 2, false},
		},
		{
			name: "an event whose data lines pass the cap together is dropped",
			caps: small,
			body: "data: " + strings.Repeat(" ", 200) + "\ndata: " + chatChunk(`{"content":"z"}`) + "\n\n" + sse(hi),
			want: used{40, 1, false},
		},
		{
			name: "a skipped line drops its whole event, not only itself",
			caps: small,
			body: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\ndata: \"pad\":\"" + strings.Repeat("y", 400) +
				"\",\ndata: \"z\":1}\n\n" + sse(hi),
			want: used{40, 1, false},
		},
		{
			name: "a skipped line drops the usage it held",
			caps: small,
			body: sse(hi, `{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1},"pad":"`+strings.Repeat("p", 400)+`"}`),
			want: used{40, 1, false},
		},
		{
			name: "empty",
			want: used{40, 0, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := tt.caps
			if caps == (meterCaps{}) {
				caps = defaultMeterCaps
			}
			checkSplits(t, rng, "text/event-stream; charset=utf-8", caps, tt.body, cost, tt.want)
		})
	}
}

func TestMeterJSON(t *testing.T) {
	rng := testSeed(t)
	cost := Cost{Prompt: 40, Output: 100, Shape: Chat}
	answer := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3},"prompt_logprobs":null}`
	big := strings.Repeat("w", 300<<10)
	tests := []struct {
		name, contentType, body string
		caps                    meterCaps
		want                    used
	}{
		{name: "a chat answer", contentType: "application/json", body: answer, want: used{12, 3, true}},
		{name: "no content type is JSON", body: answer, want: used{12, 3, true}},
		{
			name: "an embedding answer has no completion",
			body: `{"object":"list","data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":8,"total_tokens":8}}`,
			want: used{8, 0, true},
		},
		{name: "usage null", body: `{"choices":[],"usage":null}`, want: used{40, 0, false}},
		{name: "no usage", body: `{"choices":[]}`, want: used{40, 0, false}},
		{
			name: "an error answer",
			body: `{"object":"error","message":"bad request","type":"BadRequestError","code":400}`,
			want: used{40, 0, false},
		},
		{name: "not JSON", contentType: "text/plain", body: "Internal Server Error", want: used{40, 0, false}},
		{name: "a cut answer", body: answer[:len(answer)-30], want: used{40, 0, false}},
		{
			name: "a nested usage is not the answer's",
			body: `{"choices":[{"message":{"usage":{"prompt_tokens":99,"completion_tokens":99}}}]}`,
			want: used{40, 0, false},
		},
		{name: "empty", want: used{40, 0, false}},
		{
			name: "past the cap: the usage in the tail",
			body: `{"choices":[{"message":{"content":"` + big + `"}}],"usage":{"prompt_tokens":7,"completion_tokens":70000},"x":[1,{"y":2}]}`,
			want: used{7, 70000, true},
		},
		{
			name: "past the cap: a nested usage after the top-level one is skipped",
			body: `{"choices":[{"message":{"content":"` + big + `"}}],"usage":{"prompt_tokens":7,"completion_tokens":8},` +
				`"kv":{"usage":{"prompt_tokens":1,"completion_tokens":1}}}`,
			want: used{7, 8, true},
		},
		{
			name: "past the cap: \"usage\" inside a string is not a key",
			body: `{"usage":{"prompt_tokens":5,"completion_tokens":6},"choices":[{"message":{"content":"` + big +
				`","note":"\"usage\":{\"prompt_tokens\":1}}"}}]}`,
			want: used{40, 0, false},
		},
		{
			name: "past the cap: a key that ends in \\\"usage is not usage",
			body: `{"choices":[{"message":{"content":"` + big + `"}}],"say \"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
			want: used{40, 0, false},
		},
		{
			name: "past the cap: only a nested usage",
			body: `{"choices":[{"message":{"content":"` + big + `"},"usage":{"prompt_tokens":3,"completion_tokens":4}}]}`,
			want: used{40, 0, false},
		},
		{
			name: "past the cap: a usage before the tail window is not seen",
			body: `{"choices":[{"message":{"content":"` + big + `"}}],"usage":{"prompt_tokens":7,"completion_tokens":8},` +
				`"prompt_logprobs":"` + strings.Repeat("q", 20<<10) + `"}`,
			want: used{40, 0, false},
		},
		{
			name: "small caps: the tail holds the usage",
			caps: meterCaps{json: 64, tail: 100, line: 64},
			body: answer,
			want: used{12, 3, true},
		},
		{
			name: "small caps: the tail cuts the usage",
			caps: meterCaps{json: 64, tail: 60, line: 64},
			body: answer,
			want: used{40, 0, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := tt.caps
			if caps == (meterCaps{}) {
				caps = defaultMeterCaps
			}
			checkSplits(t, rng, tt.contentType, caps, tt.body, cost, tt.want)
		})
	}
}

func TestIsEventStream(t *testing.T) {
	tests := map[string]bool{
		"text/event-stream":                true,
		"Text/Event-Stream; charset=utf-8": true,
		"text/event-stream; ;;":            true, // broken parameters, a clear type
		"application/json":                 false,
		"":                                 false,
		"text/event-streams":               false,
		"text/":                            false,
	}
	got := map[string]bool{}
	for ct := range tests {
		got[ct] = isEventStream(ct)
	}
	if diff := cmp.Diff(tests, got); diff != "" {
		t.Errorf("isEventStream (-want +got):\n%s", diff)
	}
}

// TestMeterBounded: a huge SSE line and a huge JSON answer, written in
// pieces, never make the meter hold more than its caps.
func TestMeterBounded(t *testing.T) {
	tests := []struct {
		name, contentType string
		body              string
		wantMax           int
	}{
		{"sse line", "text/event-stream", "data: " + strings.Repeat("a", 4<<20), meterLineCap},
		{"sse event of many lines", "text/event-stream", strings.Repeat("data: "+strings.Repeat("b", 1000)+"\n", 4000), meterLineCap},
		{"sse empty data lines", "text/event-stream", strings.Repeat("data:\n", 1<<20), meterLineCap},
		{"json", "application/json", `{"x":"` + strings.Repeat("c", 4<<20), meterJSONCap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMeter(tt.contentType)
			body := []byte(tt.body)
			most := 0
			for i := 0; i < len(body); i += 1000 {
				_, _ = m.Write(body[i:min(i+1000, len(body))])
				buf, line, data := m.buffered()
				most = max(most, buf, line, data)
			}
			if most > tt.wantMax {
				t.Errorf("the meter held %d bytes, more than %d", most, tt.wantMax)
			}
		})
	}
}

// TestMeterReset: a reset meter is a new one for the next answer, of
// either kind, and does not keep a large buffer.
func TestMeterReset(t *testing.T) {
	m := NewMeter("text/event-stream")
	_, _ = m.Write([]byte(sse(chatChunk(`{"content":"a"}`), usageChunk(3, 1)) + "data: {\"cho"))
	m.Reset("application/json")
	_, _ = m.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}`))
	p, c, u := m.Used(Cost{Prompt: 1})
	if diff := cmp.Diff(used{9, 2, true}, used{p, c, u}); diff != "" {
		t.Errorf("JSON after SSE (-want +got):\n%s", diff)
	}
	_, _ = m.Write([]byte(strings.Repeat(" ", 200<<10)))
	m.Reset("text/event-stream")
	if got := cap(m.buf); got > meterKeepCap {
		t.Errorf("Reset kept a buffer of %d bytes", got)
	}
	_, _ = m.Write([]byte(sse(chatChunk(`{"content":"a"}`), chatChunk(`{"content":"b"}`))))
	p, c, u = m.Used(Cost{Prompt: 5})
	if diff := cmp.Diff(used{5, 2, false}, used{p, c, u}); diff != "" {
		t.Errorf("SSE after JSON (-want +got):\n%s", diff)
	}
}

// FuzzMeter: any bytes, as either kind of answer, in any pieces: no panic,
// the caps hold after every write, and the result is that of the bytes
// written whole. Small caps exercise the tail window and skipped lines.
// go test -fuzz=FuzzMeter ./dispatcher/tokens
func FuzzMeter(f *testing.F) {
	f.Add([]byte(sse(chatChunk(`{"content":"Hi"}`), usageChunk(12, 3), "[DONE]")), []byte{1, 7, 3}, true, false)
	f.Add([]byte("data: {\"choices\":\r\ndata: [{\"text\":\"x\"}]}\r\r\n\n: c\n"), []byte{2}, true, true)
	f.Add([]byte(`{"choices":[{"message":{"content":"`+strings.Repeat("z", 200)+`"}}],"usage":{"prompt_tokens":7,"completion_tokens":8}}`), []byte{5, 50}, false, true)
	f.Add([]byte(`{"usage":{"prompt_tokens":1}}`), []byte{}, false, false)
	f.Fuzz(func(t *testing.T, body, splits []byte, stream, small bool) {
		ct := "application/json"
		if stream {
			ct = "text/event-stream"
		}
		caps := defaultMeterCaps
		if small {
			caps = meterCaps{json: 96, tail: 64, line: 80}
		}
		c := Cost{Prompt: 11}
		want := meterUsed(ct, caps, body, c, func(n int) int { return n })
		m := newMeterCaps(ct, caps)
		rest := body
		for i := 0; len(rest) > 0; i++ {
			n := 1
			if len(splits) > 0 {
				n = int(splits[i%len(splits)])
			}
			n = min(max(n, 1), len(rest))
			_, _ = m.Write(rest[:n])
			rest = rest[n:]
			buf, line, data := m.buffered()
			if buf > max(caps.json, 2*caps.tail) || line > caps.line || data > caps.line {
				t.Fatalf("the meter holds %d, %d, %d bytes: over its caps %+v", buf, line, data, caps)
			}
		}
		p, cp, u := m.Used(c)
		if diff := cmp.Diff(want, used{p, cp, u}); diff != "" {
			t.Fatalf("pieces %v gave another result than the whole (-whole +pieces):\n%s", splits, diff)
		}
		if p < 0 || cp < 0 {
			t.Fatalf("Used = %d, %d", p, cp)
		}
	})
}
