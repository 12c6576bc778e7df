// Command wordcount is an example couchjobs plugin, written as a third
// party would: it imports only github.com/couchjobs/couchjobs/sdk. Its job
// type, "wordcount", counts the words of a text, reports its progress,
// keeps each word's count in the plugin's own subspace (committed with the
// job's progress, so a node that lost the job can never write), and
// finishes with the totals. See README.md.
package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/couchjobs/couchjobs/sdk"
)

// Input is a job's data.
type Input struct {
	// Text is what to count.
	Text string `json:"text"`
	// Top is how many of the most frequent words the result lists;
	// default 5.
	Top int `json:"top"`
}

// Result is a finished job's data.
type Result struct {
	Words    int         `json:"words"`
	Distinct int         `json:"distinct"`
	Top      []WordCount `json:"top"`
}

// WordCount is one word and how often it occurs.
type WordCount struct {
	Word  string `json:"word"`
	Count int    `json:"count"`
}

// config is the [plugins.wordcount.config] table.
type config struct {
	// MaxBytes refuses texts longer than this; default 1 MiB.
	MaxBytes int `json:"max_bytes"`
	// ChunkWords is how many words are counted between progress reports;
	// default 10,000.
	ChunkWords int `json:"chunk_words"`
}

// defaults is the configuration when a key is absent.
var defaults = config{MaxBytes: 1 << 20, ChunkWords: 10_000}

// cfg is the configuration in use; configure replaces it only when the new
// one is valid.
var cfg = defaults

func configure(_ context.Context, c *sdk.Config) error {
	next := defaults
	if err := c.Decode(&next); err != nil {
		return err
	}
	var errs sdk.ConfigErrors
	if next.MaxBytes <= 0 {
		errs = append(errs, sdk.ConfigError{Key: "max_bytes", Message: fmt.Sprintf("%d: want a positive number of bytes", next.MaxBytes)})
	}
	if next.ChunkWords <= 0 {
		errs = append(errs, sdk.ConfigError{Key: "chunk_words", Message: fmt.Sprintf("%d: want a positive number of words", next.ChunkWords)})
	}
	if len(errs) > 0 {
		return errs
	}
	cfg = next
	return nil
}

// count runs one job.
func count(ctx context.Context, job *sdk.Job) error {
	var in Input
	if err := job.Decode(&in); err != nil {
		return sdk.Fail(err) // bad data never gets better: no retry
	}
	if len(in.Text) > cfg.MaxBytes {
		return sdk.Failf("text of %d bytes exceeds max_bytes %d", len(in.Text), cfg.MaxBytes)
	}
	if in.Top <= 0 {
		in.Top = 5
	}
	words := Words(in.Text)
	counts := map[string]int{}
	for start := 0; start < len(words); start += cfg.ChunkWords {
		chunk := words[start:min(len(words), start+cfg.ChunkWords)]
		for _, w := range chunk {
			counts[w]++
		}
		done := start + len(chunk)
		if err := job.Update(ctx, sdk.Update{
			Fraction: float64(done) / float64(len(words)),
			Message:  fmt.Sprintf("%d of %d words", done, len(words)),
		}); err != nil {
			return err // the job was lost or canceled: stop
		}
	}
	// The per-word counts go to the plugin's subspace with the last
	// update, in the same transaction as the job's progress.
	writes := make([]sdk.Write, 0, len(counts))
	for w, c := range counts {
		writes = append(writes, sdk.Set([]byte(job.ID+"/"+w), []byte(fmt.Sprint(c))))
	}
	if err := job.Update(ctx, sdk.Update{Writes: writes, Fraction: 1, Message: "saved"}); err != nil {
		return err
	}
	return job.SetResult(Summarize(counts, in.Top))
}

// Words splits text into lowercase words.
func Words(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsNumber(r) && r != '\''
	})
}

// Summarize totals counts and lists the top most frequent words, ties in
// alphabetical order.
func Summarize(counts map[string]int, top int) Result {
	r := Result{Distinct: len(counts)}
	for w, c := range counts {
		r.Words += c
		r.Top = append(r.Top, WordCount{w, c})
	}
	sort.Slice(r.Top, func(i, j int) bool {
		if r.Top[i].Count != r.Top[j].Count {
			return r.Top[i].Count > r.Top[j].Count
		}
		return r.Top[i].Word < r.Top[j].Word
	})
	r.Top = r.Top[:min(top, len(r.Top))]
	return r
}

// newPlugin describes the plugin; main serves it, tests run it in-process
// with sdktest.
func newPlugin() *sdk.Plugin {
	return &sdk.Plugin{
		Name:    "wordcount",
		Version: "1.0.0",
		Types: []sdk.Type{{
			Name:            "wordcount",
			ActivityTimeout: 30 * time.Second,
			Worker:          sdk.WorkerFunc(count),
			ConfigSchema:    `{"type":"object","properties":{"max_bytes":{"type":"integer","minimum":1},"chunk_words":{"type":"integer","minimum":1}}}`,
		}},
		Configure: configure,
	}
}

func main() { sdk.Serve(newPlugin()) }
