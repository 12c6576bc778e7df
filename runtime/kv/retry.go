package kv

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields jittered, exponentially growing delays for retry loops.
// The zero value is not useful; set Min and Max.
type Backoff struct {
	// Min is the first delay, Max the cap.
	Min, Max time.Duration
	next     time.Duration
}

// Next returns the next delay: uniformly drawn from [d/2, d) where d starts
// at Min and doubles up to Max, so that retrying processes spread out.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Min
	}
	d := b.next
	b.next = min(2*b.next, b.Max)
	half := int64(d / 2)
	if half <= 0 {
		return d
	}
	return time.Duration(half + rand.Int64N(half))
}

// Reset starts the delays over at Min.
func (b *Backoff) Reset() { b.next = 0 }

// Sleep waits for d or until ctx is done, whichever is first, and returns
// ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
