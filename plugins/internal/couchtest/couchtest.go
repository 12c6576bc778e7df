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
	URL    string
	cmd    *exec.Cmd
	done   chan struct{}
	dir    string
	port   int
	script string
}

// Install installs pouchdb-server into the user cache directory unless it
// is there, and returns the path of its start script.
func Install() (string, error) {
	dir, err := InstallPackage("pouchdb-server", Version)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "node_modules", "pouchdb-server", "bin", "pouchdb-server"), nil
}

// InstallPackage installs an npm package (without running its scripts)
// into its own directory of the user cache, unless it is there, and
// returns that directory. Concurrent processes share one install, under a
// file lock.
func InstallPackage(name, version string) (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", errors.New("npm is missing: install Node.js and npm (Debian: apt-get install nodejs npm); .ci/run does")
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "couchjobs", name+"-"+version)
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
		return dir, nil
	}
	cmd := exec.Command("npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", dir, name+"@"+version)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install %s@%s: %v\n%s", name, version, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".installed"), nil, 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// Start starts a server for the test, with the admin account, and stops
// it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Launch starts a server with the admin account, working in dir, on a
// free port of 127.0.0.1; the caller stops it.
func Launch(dir string) (*Server, error) {
	script, err := Install()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{URL: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, port: port, script: script}
	if err := s.start(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitUp(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.configure(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// configure creates the admin account and turns pouchdb-server's own
// replicator away from _replicator (to a database of its own, which it
// creates): otherwise it runs the replications written there itself and
// rejects documents it cannot parse, as CouchDB's replicator does. Tests
// that need _replicator create it (or let the plugin under test do so).
func (s *Server) configure() error {
	// After a restart, config.json has the admin already.
	if err := s.request("PUT", "/_config/admins/"+Admin, `"`+Password+`"`, false); err != nil &&
		s.request("GET", "/_config/admins", "", true) != nil {
		return fmt.Errorf("create the admin: %w", err)
	}
	if err := s.request("PUT", "/_config/replicator/db", `"pouchdb-server-replicator"`, true); err != nil {
		return fmt.Errorf("move pouchdb-server's replicator: %w", err)
	}
	// The _replicator it made at start keeps its validation until it is
	// made again.
	if err := s.request("DELETE", "/_replicator", "", true); err != nil {
		return fmt.Errorf("drop pouchdb-server's _replicator: %w", err)
	}
	return nil
}

// Restart stops the server (if it runs) and starts it again on the same port: an
// endpoint that goes away and comes back. It starts empty (the server
// keeps its databases in memory), with the admin account.
func (s *Server) Restart() error {
	s.Stop()
	if err := s.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitUp(ctx); err != nil {
		return err
	}
	return s.configure()
}

func (s *Server) start() error {
	s.cmd = exec.Command("node", "--unhandled-rejections=warn", s.script, "-m", "-p", fmt.Sprint(s.port), "-o", "127.0.0.1", "-n")
	s.cmd.Dir = s.dir // it writes config.json and log.txt where it runs
	var out bytes.Buffer
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start pouchdb-server: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	return nil
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

// Pid is the server's process id, for benches that pin it to CPUs.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

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
