package sdk

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/couchjobs/couchjobs/sdk/proto/couchjobs/plugin/v1"
)

// Serve runs the plugin until the host stops it. It validates the
// description first and exits with a message if it is wrong. Call it from
// main.
func Serve(p *Plugin) {
	if err := p.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "couchjobs plugin %s: %v\n", p.Name, err)
		os.Exit(2)
	}
	if p.Logger == nil {
		p.Logger = hclog.New(&hclog.LoggerOptions{Name: p.Name, Level: hclog.Trace, Output: os.Stderr, JSONFormat: true})
	}
	go exitWithParent(p.Logger)
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{ProtocolVersion: {PluginKey: &GRPCPlugin{Impl: p}}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize))...)
		},
		Logger: p.Logger,
	})
}

// Validate checks the description and fills in defaults (a one-minute
// activity timeout). Serve calls it; sdktest too.
func (p *Plugin) Validate() error {
	if p.Name == "" {
		return fmt.Errorf("Plugin.Name is empty")
	}
	if len(p.Types) == 0 {
		return fmt.Errorf("the plugin declares no job types")
	}
	seen := map[string]bool{}
	for i := range p.Types {
		t := &p.Types[i]
		if t.Name == "" {
			return fmt.Errorf("job type %d has no name", i)
		}
		if seen[t.Name] {
			return fmt.Errorf("job type %q is declared twice", t.Name)
		}
		seen[t.Name] = true
		if t.Worker == nil {
			return fmt.Errorf("job type %q has no worker", t.Name)
		}
		if t.ActivityTimeout == 0 {
			t.ActivityTimeout = time.Minute
		}
		if t.ActivityTimeout < 10*time.Millisecond {
			return fmt.Errorf("job type %q: activity timeout %v is under 10ms", t.Name, t.ActivityTimeout)
		}
	}
	if _, err := p.routes(); err != nil {
		return err
	}
	return nil
}

// exitWithParent ends the plugin when the host that started it dies, so
// that no plugin outlives its host. go-plugin notices a host that closes
// the connection; a host killed with SIGKILL is noticed here, by the
// parent process changing. (The host also sets the Linux parent-death
// signal on its plugins.)
func exitWithParent(log hclog.Logger) {
	parent := os.Getppid()
	for range time.Tick(500 * time.Millisecond) {
		if os.Getppid() != parent {
			log.Warn("the host process died; exiting")
			os.Exit(3)
		}
	}
}

// GRPCPlugin is the go-plugin glue of the protocol; the host uses it to
// launch plugins, and Serve to serve one.
type GRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	// Impl is the plugin, on the plugin side; nil on the host side.
	Impl *Plugin
}

// GRPCServer serves the plugin.
func (g *GRPCPlugin) GRPCServer(broker *goplugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, newServer(g.Impl, broker))
	return nil
}

// GRPCClient returns the host's handle on a launched plugin.
func (g *GRPCPlugin) GRPCClient(_ context.Context, broker *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{Plugin: pluginv1.NewPluginClient(c), Broker: broker}, nil
}

// Client is the host's handle on a running plugin process.
type Client struct {
	Plugin pluginv1.PluginClient
	Broker *goplugin.GRPCBroker
}

// dialOptions are the gRPC options of connections a plugin opens.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize))}
}
