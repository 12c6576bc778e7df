// Package couchtest runs a real CouchDB-compatible server for tests:
// pouchdb-server 4.2.0, installed from npm once per machine (into the
// user cache directory) and started per test on 127.0.0.1 in a scratch
// directory, with an admin account. Apache CouchDB itself is not
// installable here; pouchdb-server speaks its HTTP API.
package couchtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Version is the pouchdb-server release the tests run.
const Version = "4.2.0"

// Admin and Password are the server's admin account.
const (
	Admin    = "admin"
	Password = "secret"
)

// Server is a running pouchdb-server.
type Server struct {
	// URL is the server's base URL, without credentials.
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
	dir  string
	port int
	t    testing.TB
}

// Install installs pouchdb-server into the user cache directory unless it
// is there, and returns the path of its start script. Concurrent test
// processes share one install, under a file lock.
func Install() (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", errors.New("npm is missing: install Node.js and npm (Debian: apt-get install nodejs npm); .ci/run does")
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "couchjobs", "pouchdb-server-"+Version)
	script := filepath.Join(dir, "node_modules", "pouchdb-server", "bin", "pouchdb-server")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err == nil {
		return script, nil
	}
	cmd := exec.Command("npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", dir, "pouchdb-server@"+Version)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install pouchdb-server@%s: %v\n%s", Version, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".installed"), nil, 0o644); err != nil {
		return "", err
	}
	return script, nil
}

// Start starts a server for the test, with the admin account, and stops
// it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	script, err := Install()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{URL: fmt.Sprintf("http://127.0.0.1:%d", port), dir: t.TempDir(), port: port, t: t}
	s.start(script)
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.request("PUT", "/_config/admins/"+Admin, `"`+Password+`"`, false); err != nil {
		t.Fatalf("create the admin: %v", err)
	}
	return s
}

func (s *Server) start(script string) {
	s.cmd = exec.Command("node", "--unhandled-rejections=warn", script, "-m", "-p", fmt.Sprint(s.port), "-o", "127.0.0.1", "-n")
	s.cmd.Dir = s.dir // it writes config.json and log.txt where it runs
	var out bytes.Buffer
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start pouchdb-server: %v", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
}

func (s *Server) waitUp(ctx context.Context) error {
	for {
		resp, err := http.Get(s.URL + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-s.done:
			return errors.New("pouchdb-server exited at start")
		case <-ctx.Done():
			return fmt.Errorf("pouchdb-server did not answer: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// AdminURL is the server's URL with the admin's credentials.
func (s *Server) AdminURL() string {
	return strings.Replace(s.URL, "http://", "http://"+Admin+":"+Password+"@", 1)
}

// request sends one request, as the admin if admin is set, and fails
// unless it succeeds.
func (s *Server) request(method, path, body string, admin bool) error {
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if admin {
		req.SetBasicAuth(Admin, Password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b.String())
	}
	return nil
}

// Pause freezes the server (SIGSTOP): it accepts connections but answers
// nothing, as a hung server does. Resume undoes it.
func (s *Server) Pause()  { s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Stop stops the server.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}
