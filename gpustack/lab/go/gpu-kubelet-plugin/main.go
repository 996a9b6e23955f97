// gpu-kubelet-plugin for gpustack's lab: a STAND-IN for NVIDIA's DRA kubelet plugin
// (github.com/NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin), which the Go module proxy
// does not serve and which needs a GPU. It is Kubernetes' own DRA test driver
// (k8s.io/kubernetes/test/e2e/dra/test-driver/app, the driver Kubernetes' e2e tests run),
// started under NVIDIA's driver name with the environment gpustack's DaemonSet gives NVIDIA's
// plugin:
//
//   - it registers with the kubelet over gRPC, publishes one ResourceSlice for its node and
//     prepares allocated claims by writing CDI specs (each container that lists the claim gets
//     claim_<claim>_<request>=true in its environment through containerd's CDI support);
//   - its devices are SIMULATED: GPU_COUNT whole GPUs (attribute type=gpu, as NVIDIA's driver
//     publishes a GPU: cmd/gpu-kubelet-plugin/deviceinfo.go), with productName saying
//     "stand-in" and UUIDs that name no real GPU. No device node, library or nvidia-smi is
//     given to a container;
//   - its liveness service on HEALTHCHECK_PORT answers as NVIDIA's does
//     (cmd/gpu-kubelet-plugin/health.go@22407113785e78c7763b4637689a201eb39c6199): SERVING
//     when the kubelet's registration socket answers GetInfo and the DRA socket answers an
//     empty NodePrepareResources.
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path"
	"strconv"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

const driverName = "gpu.nvidia.com"

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func main() {
	klog.InitFlags(nil) // -v N, as gpustack's DaemonSet passes to NVIDIA's plugin
	flag.Parse()
	if err := run(); err != nil {
		klog.ErrorS(err, "gpu-kubelet-plugin (gpustack lab stand-in) failed")
		os.Exit(1)
	}
}

func run() error {
	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		return fmt.Errorf("NODE_NAME is not set")
	}
	count, err := strconv.Atoi(env("GPU_COUNT", "2"))
	if err != nil || count < 0 {
		return fmt.Errorf("GPU_COUNT=%q is not a count", os.Getenv("GPU_COUNT"))
	}
	cdiDir := env("CDI_ROOT", "/var/run/cdi")
	registrarDir := env("KUBELET_REGISTRAR_DIRECTORY_PATH", kubeletplugin.KubeletRegistryDir)
	pluginDir := path.Join(env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"), driverName)
	for _, dir := range []string{cdiDir, pluginDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	config, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// The liveness service first: it answers NOT_SERVING until the plugin's sockets answer.
	if port := env("HEALTHCHECK_PORT", "-1"); port != "-1" {
		server, err := serveHealth(port, registrarDir, pluginDir)
		if err != nil {
			return err
		}
		defer server.GracefulStop()
	}
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			nodeName: {Slices: []resourceslice.Slice{{Devices: devices(nodeName, count)}}},
		},
	}
	plugin, err := app.StartPlugin(ctx, cdiDir, driverName, client, nodeName,
		app.FileOperations{DriverResources: &resources},
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
	)
	if err != nil {
		return err
	}
	defer plugin.Stop()

	klog.InfoS("gpustack lab stand-in for NVIDIA's DRA kubelet plugin running", "node", nodeName,
		"simulatedGPUs", count)
	<-ctx.Done()
	return nil
}

// devices: simulated whole GPUs, with the attributes NVIDIA's driver gives a GPU that a
// DeviceClass selects on (type) or a user reads (uuid, productName, index).
func devices(nodeName string, count int) []resourceapi.Device {
	found := make([]resourceapi.Device, count)
	for i := range found {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", nodeName, i)))
		uuid := fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		found[i] = resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":        {StringValue: ptr("gpu")},
				"uuid":        {StringValue: ptr(uuid)},
				"productName": {StringValue: ptr("gpustack lab stand-in (no GPU)")},
				"index":       {IntValue: ptr(int64(i))},
			},
		}
	}
	return found
}

func ptr[T any](v T) *T { return &v }

type health struct {
	healthpb.UnimplementedHealthServer
	registration registerapi.RegistrationClient
	dra          drapb.DRAPluginClient
}

func serveHealth(port, registrarDir, pluginDir string) (*grpc.Server, error) {
	listener, err := net.Listen("tcp", net.JoinHostPort("", port))
	if err != nil {
		return nil, fmt.Errorf("listen for the health service on port %s: %w", port, err)
	}
	dial := func(socket string) (*grpc.ClientConn, error) {
		target := (&url.URL{Scheme: "unix", Path: socket}).String()
		return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	regConn, err := dial(path.Join(registrarDir, driverName+"-reg.sock"))
	if err != nil {
		return nil, err
	}
	draConn, err := dial(path.Join(pluginDir, "dra.sock"))
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	healthpb.RegisterHealthServer(server, &health{
		registration: registerapi.NewRegistrationClient(regConn),
		dra:          drapb.NewDRAPluginClient(draConn),
	})
	go func() {
		if err := server.Serve(listener); err != nil {
			klog.ErrorS(err, "health service stopped")
		}
	}()
	return server, nil
}

func (h *health) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if service := req.GetService(); service != "" && service != "liveness" {
		return nil, status.Error(codes.NotFound, "unknown service")
	}
	answer := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}
	if _, err := h.registration.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		klog.ErrorS(err, "health: GetInfo on the registration socket failed")
		return answer, nil
	}
	if _, err := h.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		klog.ErrorS(err, "health: an empty NodePrepareResources failed")
		return answer, nil
	}
	answer.Status = healthpb.HealthCheckResponse_SERVING
	return answer, nil
}
