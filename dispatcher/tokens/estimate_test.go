package tokens

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEstimate(t *testing.T) {
	const chat, compl, embed = PathChat, PathCompletions, PathEmbeddings
	long := strings.Repeat("x", 4000)
	tests := []struct {
		name, path, body string
		ratio            float64
		defaultMax       int
		want             Cost
	}{
		{
			name: "chat string content",
			path: chat, body: `{"model":"m","messages":[{"role":"user","content":"hello world!"}]}`,
			want: Cost{Prompt: 3, PromptBytes: 12, Output: 1024, Shape: Chat},
		},
		{
			name: "chat messages add up, null content counts nothing",
			path: chat, body: `{"messages":[{"role":"system","content":"abcd"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"user","content":"efghi"}]}`,
			want: Cost{Prompt: 3, PromptBytes: 9, Output: 1024, Shape: Chat},
		},
		{
			name: "chat parts: text parts count, an image part does not",
			path: chat, body: `{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAA"}},{"type":"text","text":"efgh"}]}]}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Output: 1024, Shape: Chat},
		},
		{
			name: "bytes are the decoded text's: an escape is its UTF-8",
			path: chat, body: `{"messages":[{"role":"user","content":"\u00e9t\u00e9"}]}`,
			want: Cost{Prompt: 2, PromptBytes: 5, Output: 1024, Shape: Chat},
		},
		{
			name: "a prompt of one byte is one token",
			path: chat, body: `{"messages":[{"role":"user","content":"a"}]}`,
			want: Cost{Prompt: 1, PromptBytes: 1, Output: 1024, Shape: Chat},
		},
		{
			name: "an empty prompt is no token",
			path: chat, body: `{"messages":[{"role":"user","content":""}]}`,
			want: Cost{Prompt: 0, PromptBytes: 0, Output: 1024, Shape: Chat},
		},
		{
			name: "max_completion_tokens before max_tokens, times n",
			path: chat, body: `{"messages":[],"max_completion_tokens":100,"max_tokens":50,"n":3}`,
			want: Cost{Output: 300, Shape: Chat},
		},
		{
			name: "max_tokens",
			path: chat, body: `{"messages":[],"max_tokens":50}`,
			want: Cost{Output: 50, Shape: Chat},
		},
		{
			name: "max_completion_tokens 0 is absent, as vLLM reads it",
			path: chat, body: `{"messages":[],"max_completion_tokens":0,"max_tokens":50}`,
			want: Cost{Output: 50, Shape: Chat},
		},
		{
			name: "negative maxima are absent: the default",
			path: chat, body: `{"messages":[],"max_completion_tokens":-5,"max_tokens":-1}`,
			want: Cost{Output: 1024, Shape: Chat},
		},
		{
			name: "numbers written as floats",
			path: chat, body: `{"messages":[],"max_tokens":1e3,"n":2.0}`,
			want: Cost{Output: 2000, Shape: Chat},
		},
		{
			name: "a fraction rounds up",
			path: chat, body: `{"messages":[],"max_tokens":1.5,"n":1.5}`,
			want: Cost{Output: 4, Shape: Chat},
		},
		{
			name: "an absurd maximum saturates",
			path: chat, body: `{"messages":[],"max_tokens":1e300,"n":1e300}`,
			want: Cost{Output: MaxOutput, Shape: Chat},
		},
		{
			name: "n below 1 is 1",
			path: chat, body: `{"messages":[],"max_tokens":7,"n":0}`,
			want: Cost{Output: 7, Shape: Chat},
		},
		{
			name: "fields of the wrong type are ignored, the rest is read",
			path: chat, body: `{"messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":"lots","n":"two","stream":"yes","max_completion_tokens":9}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Output: 9, Shape: Chat},
		},
		{
			name: "names are exact: a key in other case is not the field",
			path: chat, body: `{"messages":[{"role":"user","content":"abcdefgh","Content":""}],"max_tokens":50,"MAX_TOKENS":1,"Max_Completion_Tokens":2,"N":9}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Output: 50, Shape: Chat},
		},
		{
			name: "names are exact: in parts, and for max_completion_tokens",
			path: chat, body: `{"messages":[{"content":[{"type":"text","text":"abcd","TEXT":""}]}],"max_completion_tokens":3,"MAX_COMPLETION_TOKENS":1,"Stream":true}`,
			want: Cost{Prompt: 1, PromptBytes: 4, Output: 3, Shape: Chat},
		},
		{
			name: "names are exact: Messages is not messages",
			path: chat, body: `{"Messages":[{"content":"abcd"}],"max_tokens":5}`,
			want: Cost{Output: 5, Shape: Chat},
		},
		{
			name: "names are exact: Prompt is not prompt",
			path: compl, body: `{"prompt":"abcdefgh","Prompt":"","max_tokens":5}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Output: 5, Shape: Completion},
		},
		{
			name: "a repeated key: the last",
			path: chat, body: `{"messages":[],"max_tokens":1,"max_tokens":7}`,
			want: Cost{Output: 7, Shape: Chat},
		},
		{
			name: "messages of the wrong type count nothing",
			path: chat, body: `{"messages":"hello","max_tokens":5}`,
			want: Cost{Output: 5, Shape: Chat},
		},
		{
			name: "stream with usage",
			path: chat, body: `{"messages":[],"stream":true,"stream_options":{"include_usage":true}}`,
			want: Cost{Output: 1024, Shape: Chat, Stream: true, IncludeUsage: true},
		},
		{
			name: "include_usage without a stream",
			path: chat, body: `{"messages":[],"stream":false,"stream_options":{"include_usage":true}}`,
			want: Cost{Output: 1024, Shape: Chat},
		},
		{
			name: "stream without usage",
			path: chat, body: `{"messages":[],"stream":true}`,
			want: Cost{Output: 1024, Shape: Chat, Stream: true},
		},
		{
			name: "completion: a string prompt",
			path: compl, body: `{"prompt":"` + long + `","max_tokens":16}`,
			want: Cost{Prompt: 1000, PromptBytes: 4000, Output: 16, Shape: Completion},
		},
		{
			name: "completion: a batch of prompts, n choices each",
			path: compl, body: `{"prompt":["abcd","efgh","ij"],"max_tokens":10,"n":2}`,
			want: Cost{Prompt: 3, PromptBytes: 10, Output: 60, Shape: Completion},
		},
		{
			name: "completion: token ids are tokens",
			path: compl, body: `{"prompt":[101, 2023, 2003, 1037],"max_tokens":10}`,
			want: Cost{Prompt: 4, Output: 10, Shape: Completion},
		},
		{
			name: "completion: a batch of token id arrays",
			path: compl, body: `{"prompt":[[1,2,3],[4,5]],"max_tokens":10}`,
			want: Cost{Prompt: 5, Output: 20, Shape: Completion},
		},
		{
			name: "completion: an empty batch",
			path: compl, body: `{"prompt":[],"max_tokens":10}`,
			want: Cost{Output: 10, Shape: Completion},
		},
		{
			name: "completion: a prompt of the wrong type",
			path: compl, body: `{"prompt":{"text":"abcd"},"max_tokens":10}`,
			want: Cost{Output: 10, Shape: Completion},
		},
		{
			name: "completion: a mixed batch counts what is of the first's kind",
			path: compl, body: `{"prompt":["abcd",7,"efgh"],"max_tokens":10}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Output: 30, Shape: Completion},
		},
		{
			name: "completion: streamed",
			path: compl, body: `{"prompt":"abcd","stream":true,"stream_options":{"include_usage":true}}`,
			want: Cost{Prompt: 1, PromptBytes: 4, Output: 1024, Shape: Completion, Stream: true, IncludeUsage: true},
		},
		{
			name: "embedding: a string, no output",
			path: embed, body: `{"input":"abcdefgh","max_tokens":100}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Shape: Embedding},
		},
		{
			name: "embedding: strings",
			path: embed, body: `{"input":["abcd","efgh"]}`,
			want: Cost{Prompt: 2, PromptBytes: 8, Shape: Embedding},
		},
		{
			name: "embedding: token ids",
			path: embed, body: `{"input":[[1,2],[3,4,5]]}`,
			want: Cost{Prompt: 5, Shape: Embedding},
		},
		{
			name: "another path: bytes over the ratio, no output",
			path: "/v1/responses", body: `{"input":"abcdefgh","max_output_tokens":100}`,
			want: Cost{Prompt: 11},
		},
		{
			name: "a path with a trailing slash is another path",
			path: chat + "/", body: `{"messages":[]}`,
			want: Cost{Prompt: 4},
		},
		{
			name: "another path, empty body",
			path: "/v1/models",
			want: Cost{},
		},
		{
			name: "not JSON",
			path: chat, body: `hello there`,
			want: Cost{Prompt: 3},
		},
		{
			name: "broken JSON",
			path: chat, body: `{"messages":[{"content":"abc"}`,
			want: Cost{Prompt: 8},
		},
		{
			name: "JSON that is not an object",
			path: compl, body: ` ["abcd"]`,
			want: Cost{Prompt: 3},
		},
		{
			name: "a learned ratio",
			path: chat, body: `{"messages":[{"content":"` + long + `"}],"max_tokens":1}`,
			ratio: 3.3,
			want:  Cost{Prompt: 1213, PromptBytes: 4000, Output: 1, Shape: Chat},
		},
		{
			name: "a ratio below range counts as 1",
			path: chat, body: `{"messages":[{"content":"abcd"}],"max_tokens":1}`,
			ratio: 0.01,
			want:  Cost{Prompt: 4, PromptBytes: 4, Output: 1, Shape: Chat},
		},
		{
			name: "a ratio above range counts as 32",
			path: chat, body: `{"messages":[{"content":"` + long + `"}],"max_tokens":1}`,
			ratio: 1e9,
			want:  Cost{Prompt: 125, PromptBytes: 4000, Output: 1, Shape: Chat},
		},
		{
			name: "a NaN ratio is the default",
			path: chat, body: `{"messages":[{"content":"abcdefgh"}],"max_tokens":1}`,
			ratio: math.NaN(),
			want:  Cost{Prompt: 2, PromptBytes: 8, Output: 1, Shape: Chat},
		},
		{
			name: "the policy's default maximum",
			path: chat, body: `{"messages":[]}`,
			defaultMax: 256,
			want:       Cost{Output: 256, Shape: Chat},
		},
		{
			name: "a default maximum below 1 is the package default",
			path: chat, body: `{"messages":[]}`,
			defaultMax: -3,
			want:       Cost{Output: 1024, Shape: Chat},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ratio, defaultMax := tt.ratio, tt.defaultMax
			if ratio == 0 {
				ratio = DefaultBytesPerToken
			}
			if defaultMax == 0 {
				defaultMax = 1024
			}
			got := Estimate(tt.path, []byte(tt.body), ratio, defaultMax)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Estimate(%q, %s) (-want +got):\n%s", tt.path, tt.body, diff)
			}
		})
	}
}

func TestReservation(t *testing.T) {
	got := Cost{Prompt: 300, Output: 1000, PromptBytes: 1200}.Reservation()
	if diff := cmp.Diff(int64(1300), got); diff != "" {
		t.Errorf("Reservation (-want +got):\n%s", diff)
	}
}

func TestShapeString(t *testing.T) {
	got := []string{Other.String(), Chat.String(), Completion.String(), Embedding.String(), Shape(9).String()}
	want := []string{"other", "chat", "completion", "embedding", "other"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Shape.String (-want +got):\n%s", diff)
	}
}

// FuzzEstimate: any path, body, ratio and default, Estimate neither
// panics nor returns a negative or unbounded cost. Seeds: the shapes of
// TestEstimate. go test -fuzz=FuzzEstimate ./dispatcher/tokens
func FuzzEstimate(f *testing.F) {
	seeds := []string{
		`{"messages":[{"role":"user","content":"hello"}],"max_tokens":5,"n":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"content":[{"type":"text","text":"ab"},{"type":"image_url","image_url":{}}]}]}`,
		`{"prompt":["ab","cd"],"max_completion_tokens":1e30}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"input":[1,2,3]}`,
		`{"prompt":[`,
		`not json`,
		``,
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s), 4.0, 1024)
	}
	f.Add(uint8(0), []byte(`{"messages":[{"content":"\ud800\ud800"}]}`), -1.0, -1)
	paths := []string{PathChat, PathCompletions, PathEmbeddings, "/other"}
	f.Fuzz(func(t *testing.T, path uint8, body []byte, ratio float64, defaultMax int) {
		c := Estimate(paths[int(path)%len(paths)], body, ratio, defaultMax)
		if c.Reservation() < 0 || c.Prompt < 0 || c.Output < 0 || c.Output > MaxOutput || c.PromptBytes < 0 {
			t.Fatalf("Estimate = %+v: a negative or unbounded cost", c)
		}
		// Decoding replaces an invalid byte with U+FFFD (3 bytes), at most.
		if c.PromptBytes > 3*int64(len(body)) || c.Prompt > 3*int64(len(body)) {
			t.Fatalf("Estimate = %+v from %d bytes", c, len(body))
		}
		if c.IncludeUsage && !c.Stream {
			t.Fatalf("Estimate = %+v: usage without a stream", c)
		}
	})
}
