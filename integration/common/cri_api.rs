//! The slice of the CRI v1 API (`runtime.v1`, Kubernetes' `api.proto`) the CRI tests use,
//! written by hand instead of pulling in a generated crate: only the fields the tests set or
//! read (and the ids and messages that failure output shows), with the field numbers and types
//! of the proto: fields left out are skipped on decode and never sent, as if unset. The
//! clients are unary calls over `tonic::client::Grpc` with prost's codec.
//!
//! Names, and `Copy` on messages of scalars only, follow what prost generates from the proto, so
//! the tests read as with generated code.

use std::collections::HashMap;

use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic::{Response, Status};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NamespaceMode {
    Pod = 0,
    Container = 1,
    Node = 2,
    Target = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    #[prost(enumeration = "NamespaceMode", tag = "1")]
    pub network: i32,
    #[prost(enumeration = "NamespaceMode", tag = "2")]
    pub pid: i32,
    #[prost(enumeration = "NamespaceMode", tag = "3")]
    pub ipc: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopPodSandboxResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemovePodSandboxResponse {}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(string, tag = "9")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub resources: Option<LinuxContainerResources>,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoveContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerFilter {
    #[prost(string, tag = "3")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {
    #[prost(message, optional, tag = "1")]
    pub filter: Option<ContainerFilter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
#[allow(clippy::enum_variant_names)] // The proto's names.
pub enum ContainerState {
    ContainerCreated = 0,
    ContainerRunning = 1,
    ContainerExited = 2,
    ContainerUnknown = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(enumeration = "ContainerState", tag = "3")]
    pub state: i32,
    #[prost(int64, tag = "5")]
    pub started_at: i64,
    #[prost(int64, tag = "6")]
    pub finished_at: i64,
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    #[prost(string, tag = "10")]
    pub reason: String,
    #[prost(string, tag = "11")]
    pub message: String,
    #[prost(message, optional, tag = "16")]
    pub resources: Option<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(message, optional, tag = "1")]
    pub linux: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerResources {
    #[prost(int64, tag = "3")]
    pub cpu_shares: i64,
    #[prost(int64, tag = "4")]
    pub memory_limit_in_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdateContainerResourcesRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(message, optional, tag = "2")]
    pub linux: Option<LinuxContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdateContainerResourcesResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(int64, tag = "3")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub stdout: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub stderr: Vec<u8>,
    #[prost(int32, tag = "3")]
    pub exit_code: i32,
}

/// Exec with streams: containerd answers with a URL on its streaming server, where the
/// client attaches over SPDY or WebSocket (`common::cri_stream`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(bool, tag = "3")]
    pub tty: bool,
    #[prost(bool, tag = "4")]
    pub stdin: bool,
    #[prost(bool, tag = "5")]
    pub stdout: bool,
    #[prost(bool, tag = "6")]
    pub stderr: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecResponse {
    #[prost(string, tag = "1")]
    pub url: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsResponse {
    #[prost(message, optional, tag = "1")]
    pub stats: Option<ContainerStats>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStats {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<ContainerAttributes>,
    #[prost(message, optional, tag = "2")]
    pub cpu: Option<CpuUsage>,
    #[prost(message, optional, tag = "3")]
    pub memory: Option<MemoryUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAttributes {
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct CpuUsage {
    #[prost(message, optional, tag = "2")]
    pub usage_core_nano_seconds: Option<UInt64Value>,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct MemoryUsage {
    #[prost(message, optional, tag = "2")]
    pub working_set_bytes: Option<UInt64Value>,
    #[prost(message, optional, tag = "4")]
    pub usage_bytes: Option<UInt64Value>,
}

/// Sends one unary call to `path` (`/<package>.<Service>/<Method>`).
async fn unary<Req, Resp>(grpc: &mut Grpc<Channel>, path: &'static str, req: Req) -> Result<Response<Resp>, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(req), path, ProstCodec::default()).await
}

/// Declares a client whose methods are unary calls of one CRI service.
macro_rules! client {
    ($(#[$doc:meta])* $name:ident, $service:literal, { $($method:ident($req:ty) -> $resp:ty = $rpc:literal;)* }) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            grpc: Grpc<Channel>,
        }

        impl $name {
            pub fn new(channel: Channel) -> Self {
                Self { grpc: Grpc::new(channel) }
            }

            $(
                pub async fn $method(&mut self, req: $req) -> Result<Response<$resp>, Status> {
                    unary(&mut self.grpc, concat!("/", $service, "/", $rpc), req).await
                }
            )*
        }
    };
}

client!(
    /// `runtime.v1.RuntimeService`: the calls kubelet makes for pods and containers.
    RuntimeServiceClient, "runtime.v1.RuntimeService", {
    version(VersionRequest) -> VersionResponse = "Version";
    run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse = "RunPodSandbox";
    stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse = "StopPodSandbox";
    remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse = "RemovePodSandbox";
    pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse = "PodSandboxStatus";
    create_container(CreateContainerRequest) -> CreateContainerResponse = "CreateContainer";
    start_container(StartContainerRequest) -> StartContainerResponse = "StartContainer";
    stop_container(StopContainerRequest) -> StopContainerResponse = "StopContainer";
    remove_container(RemoveContainerRequest) -> RemoveContainerResponse = "RemoveContainer";
    list_containers(ListContainersRequest) -> ListContainersResponse = "ListContainers";
    container_status(ContainerStatusRequest) -> ContainerStatusResponse = "ContainerStatus";
    update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse
        = "UpdateContainerResources";
    exec_sync(ExecSyncRequest) -> ExecSyncResponse = "ExecSync";
    exec(ExecRequest) -> ExecResponse = "Exec";
    container_stats(ContainerStatsRequest) -> ContainerStatsResponse = "ContainerStats";
});

client!(
    /// `runtime.v1.ImageService`: only ImageStatus, to wait for the imported images.
    ImageServiceClient, "runtime.v1.ImageService", {
    image_status(ImageStatusRequest) -> ImageStatusResponse = "ImageStatus";
});
