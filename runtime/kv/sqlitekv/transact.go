package sqlitekv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/couchjobs/couchjobs/runtime/kv"
)

// Transact runs fn in a write transaction. See kv.Transactor.
func (s *Store) Transact(ctx context.Context, fn func(kv.Tx) (any, error)) (any, error) {
	b := kv.Backoff{Min: time.Millisecond, Max: 100 * time.Millisecond}
	for {
		v, err := s.attempt(ctx, fn)
		if err == nil || !kv.IsRetryable(err) {
			return v, err
		}
		s.log.Trace("retrying transaction", "error", err)
		if err := kv.Sleep(ctx, b.Next()); err != nil {
			return nil, err
		}
	}
}

// attempt runs fn once, holding the writer from BEGIN IMMEDIATE to COMMIT.
func (s *Store) attempt(ctx context.Context, fn func(kv.Tx) (any, error)) (result any, err error) {
	if err := s.lockWriter(ctx); err != nil {
		return nil, err
	}
	defer func() { <-s.writeMu }()
	c := s.writer
	if err := s.retryBusy(ctx, func() error { _, err := c.begin.ExecContext(bg); return err }); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	t := &tx{s: s, ctx: ctx, c: c, deadline: time.Now().Add(s.opts.TransactionTimeout)}
	if s.watches.active() {
		t.touched = &touches{}
	}
	committed := false
	defer func() {
		// Also runs when fn panics, so the lock is never left held.
		if !committed {
			if _, rerr := c.rollback.ExecContext(bg); rerr != nil {
				s.log.Error("rollback failed", "error", rerr)
			}
			failWatches(t.watches, err)
			if t.vs != nil {
				t.vs.set, t.vs.err = true, err
			}
		}
	}()
	result, err = fn(t)
	if err == nil {
		err = t.err
	}
	if err != nil {
		return nil, err
	}
	if err = t.prepareCommit(); err != nil {
		return nil, err
	}
	if _, err = c.commit.ExecContext(bg); err != nil {
		err = fmt.Errorf("commit: %w", err)
		return nil, err
	}
	committed = true
	s.afterCommit(t)
	return result, nil
}

// lockWriter takes the process's writer slot, giving up when ctx is done or
// the store closes.
func (s *Store) lockWriter(ctx context.Context) error {
	if s.closed.Load() {
		return kv.ErrStoreClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.writeMu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return kv.ErrStoreClosed
	}
	if s.closed.Load() {
		<-s.writeMu
		return kv.ErrStoreClosed
	}
	return nil
}

// prepareCommit does what must happen inside the transaction just before
// COMMIT: the final limit checks, the watches' starting values, and the
// commit version.
func (t *tx) prepareCommit() error {
	if err := t.check(); err != nil {
		return err
	}
	for _, w := range t.watches {
		v, err := t.get(w.key)
		if err != nil {
			return err
		}
		w.present, w.baseline = v != nil, v
	}
	if t.mutated {
		if _, err := t.allocate(); err != nil {
			return err
		}
	}
	return nil
}

// afterCommit completes the versionstamp, wakes watchers in this and other
// processes, and activates the transaction's watches.
func (s *Store) afterCommit(t *tx) {
	if t.vs != nil {
		t.vs.set = true
		if t.mutated {
			t.vs.vs = versionstamp(t.version)
		} else {
			t.vs.err = kv.ErrNoCommitVersion
		}
	}
	if t.mutated {
		s.lastVersion = t.version
		s.watches.committed(t.version, t.touched)
	}
	if len(t.watches) > 0 {
		s.watches.register(t.watches)
	}
}

// ReadTransact runs fn in a read-only transaction on a consistent snapshot.
// Read transactions run beside the writer and beside each other.
func (s *Store) ReadTransact(ctx context.Context, fn func(kv.ReadTx) (any, error)) (any, error) {
	b := kv.Backoff{Min: time.Millisecond, Max: 100 * time.Millisecond}
	for {
		v, err := s.readAttempt(ctx, fn)
		if err == nil || !kv.IsRetryable(err) {
			return v, err
		}
		if err := kv.Sleep(ctx, b.Next()); err != nil {
			return nil, err
		}
	}
}

func (s *Store) readAttempt(ctx context.Context, fn func(kv.ReadTx) (any, error)) (any, error) {
	c, err := s.takeReader(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { s.readers <- c }()
	if _, err := c.begin.ExecContext(bg); err != nil {
		return nil, fmt.Errorf("begin read transaction: %w", err)
	}
	defer func() {
		if _, err := c.rollback.ExecContext(bg); err != nil {
			s.log.Error("ending read transaction failed", "error", err)
		}
	}()
	t := &tx{ctx: ctx, c: c, deadline: time.Now().Add(s.opts.TransactionTimeout)}
	v, err := fn(t)
	if err == nil {
		err = t.err
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (s *Store) takeReader(ctx context.Context) (*conn, error) {
	if s.closed.Load() {
		return nil, kv.ErrStoreClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case c := <-s.readers:
		if s.closed.Load() {
			s.readers <- c
			return nil, kv.ErrStoreClosed
		}
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, kv.ErrStoreClosed
	}
}

// failWatches fails the watches of a transaction that did not commit.
func failWatches(ws []*watch, err error) {
	if err == nil {
		err = errors.New("transaction did not commit")
	}
	for _, w := range ws {
		w.fire(fmt.Errorf("watch of an uncommitted transaction: %w", err))
	}
}
