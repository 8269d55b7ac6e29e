package tokens

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Benchmarks of the token path's pieces. Each has a baseline in the same
// run to quote ratios against: json.Valid over the same bytes (the least
// any reading of them costs). Run with
// go test -run=^$ -bench=. -benchmem -benchtime=1000x ./dispatcher/tokens

// chatBody is a chat request of about size bytes: a system prompt and a
// user message of filler text.
func chatBody(size int) []byte {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", size/45+1)[:max(size-200, 1)]
	return []byte(`{"model":"llama","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"` + text + `"}],"max_tokens":256,"stream":true,"stream_options":{"include_usage":true}}`)
}

func BenchmarkEstimate(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10} {
		body := chatBody(size)
		b.Run(fmt.Sprintf("chat %dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if c := Estimate(PathChat, body, 4, 1024); c.Prompt == 0 {
					b.Fatal("no prompt")
				}
			}
		})
		b.Run(fmt.Sprintf("baseline json.Valid %dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if !json.Valid(body) {
					b.Fatal("invalid")
				}
			}
		})
	}
}

// streamEvents is a 500-chunk chat stream as vLLM writes it, one event a
// write, with a final usage chunk and [DONE].
func streamEvents(chunks int) [][]byte {
	events := make([][]byte, 0, chunks+3)
	events = append(events, []byte(sse(chatChunk(`{"role":"assistant","content":""}`))))
	for i := range chunks {
		events = append(events, []byte(sse(chatChunk(fmt.Sprintf(`{"content":" word%d"}`, i)))))
	}
	return append(events, []byte(sse(usageChunk(120, int64(chunks)))), []byte(sse("[DONE]")))
}

func BenchmarkMeterStream(b *testing.B) {
	events := streamEvents(500)
	var total int64
	for _, e := range events {
		total += int64(len(e))
	}
	b.Run("500 chunks", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(total)
		m := NewMeter("text/event-stream")
		for b.Loop() {
			m.Reset("text/event-stream")
			for _, e := range events {
				_, _ = m.Write(e)
			}
			if _, c, _ := m.Used(Cost{}); c != 500 {
				b.Fatalf("completion %d", c)
			}
		}
	})
	b.Run("baseline json.Valid per event", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(total)
		for b.Loop() {
			for _, e := range events[:len(events)-1] {
				if !json.Valid(e[len("data: ") : len(e)-2]) {
					b.Fatal("invalid")
				}
			}
		}
	})
}

func BenchmarkMeterJSON(b *testing.B) {
	content := strings.Repeat("All work and no play makes Jack a dull boy. ", 50)
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"llama",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + content + `"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":120,"total_tokens":620,"completion_tokens":500}}`)
	b.Run("2KiB answer", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(answer)))
		m := NewMeter("application/json")
		for b.Loop() {
			m.Reset("application/json")
			_, _ = m.Write(answer)
			if _, c, _ := m.Used(Cost{}); c != 500 {
				b.Fatalf("completion %d", c)
			}
		}
	})
	b.Run("baseline json.Valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(answer)))
		for b.Loop() {
			if !json.Valid(answer) {
				b.Fatal("invalid")
			}
		}
	})
}

// benchClock is a clock the benchmark moves by hand: a fake clock's lock
// is not what is measured.
type benchClock struct{ now time.Time }

func (c *benchClock) Now() time.Time                  { return c.now }
func (c *benchClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

// BenchmarkLocalReserveSettle is one request's budget work: a Reserve and
// its Settle, 1 ms apart, round-robin over tenants that are all known.
func BenchmarkLocalReserveSettle(b *testing.B) {
	ctx := context.Background()
	lim := policy.Limits{RequestsPerMinute: 1 << 20, TokensPerMinute: 1 << 30}
	for _, tenants := range []int{1, 10000} {
		keys := make([]Key, tenants)
		for i := range keys {
			keys[i] = Key{Pool: "default/pool", Tenant: fmt.Sprintf("tenant-%d", i)}
		}
		b.Run(fmt.Sprintf("%d tenants", tenants), func(b *testing.B) {
			b.ReportAllocs()
			clk := &benchClock{now: t0}
			l := NewLocal(clk)
			for _, k := range keys { // every tenant known: the steady state
				_, _ = l.Reserve(ctx, k, lim, 0)
			}
			i := 0
			for b.Loop() {
				k := keys[i%tenants]
				i++
				d, _ := l.Reserve(ctx, k, lim, 1300)
				if !d.OK {
					b.Fatalf("refused: %+v", d)
				}
				clk.now = clk.now.Add(time.Millisecond)
				_, _ = l.Settle(ctx, k, lim, Settlement{Reserved: 1300, Used: 900})
			}
		})
	}
}
