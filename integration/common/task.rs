//! One process's Task API requests in one line each. The tests ask the daemon many small
//! things (start, wait, kill, delete, state…); the request structs, `..Default::default()`
//! and the deadline around each are said here once, so a test reads as the engine's sequence
//! of calls it stands for.

use containerd_shim_protos::api::{
    CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, DeleteRequest, DeleteResponse,
    ExecProcessRequest, KillRequest, PauseRequest, PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest,
    ShutdownRequest, StartRequest, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
    WaitRequest, WaitResponse,
};
use containerd_shim_protos::shim_async::TaskClient;
use protobuf::well_known_types::any::Any;
use protobuf::well_known_types::empty::Empty;
use protobuf::MessageField;

use super::ctx;

/// A container (`exec_id` empty) or one of its execs, on one daemon's client.
#[derive(Clone)]
pub struct Task<'a> {
    client: &'a TaskClient,
    id: String,
    exec_id: String,
}

/// The container `id`'s init process on `client`.
pub fn task<'a>(client: &'a TaskClient, id: &str) -> Task<'a> {
    Task {
        client,
        id: id.to_string(),
        exec_id: String::new(),
    }
}

/// A runtime-spec `Process` as the engines send it in an exec request.
pub fn process_any(process: serde_json::Value) -> Any {
    let mut any = Any::new();
    any.type_url = "types.containerd.io/opencontainers/runtime-spec/1/Process".into();
    any.value = serde_json::to_vec(&process).unwrap();
    any
}

impl<'a> Task<'a> {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The exec `exec_id` of the same container.
    pub fn exec(&self, exec_id: &str) -> Task<'a> {
        Task {
            exec_id: exec_id.to_string(),
            ..self.clone()
        }
    }

    /// The request to add this exec with `spec`; callers set stdio and terminal on it.
    pub fn exec_request(&self, spec: Option<Any>) -> ExecProcessRequest {
        ExecProcessRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            spec: spec.into(),
            ..Default::default()
        }
    }

    /// Adds this exec with `spec` and no stdio.
    pub async fn add(&self, spec: Option<Any>) -> ttrpc::Result<Empty> {
        self.client.exec(ctx(), &self.exec_request(spec)).await
    }

    pub async fn start(&self) -> ttrpc::Result<u32> {
        let req = StartRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            ..Default::default()
        };
        self.client.start(ctx(), &req).await.map(|r| r.pid)
    }

    /// Waits for the exit; the exit status.
    pub async fn wait(&self) -> ttrpc::Result<WaitResponse> {
        let req = WaitRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            ..Default::default()
        };
        self.client.wait(ctx(), &req).await
    }

    pub async fn kill(&self, signal: u32) -> ttrpc::Result<Empty> {
        self.kill_req(signal, false).await
    }

    /// Kill with `all` set: every process of the container.
    pub async fn kill_all(&self, signal: u32) -> ttrpc::Result<Empty> {
        self.kill_req(signal, true).await
    }

    async fn kill_req(&self, signal: u32, all: bool) -> ttrpc::Result<Empty> {
        let req = KillRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            signal,
            all,
            ..Default::default()
        };
        self.client.kill(ctx(), &req).await
    }

    pub async fn delete(&self) -> ttrpc::Result<DeleteResponse> {
        let req = DeleteRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            ..Default::default()
        };
        self.client.delete(ctx(), &req).await
    }

    pub async fn state(&self) -> ttrpc::Result<StateResponse> {
        let req = StateRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            ..Default::default()
        };
        self.client.state(ctx(), &req).await
    }

    pub async fn pause(&self) -> ttrpc::Result<Empty> {
        let req = PauseRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.pause(ctx(), &req).await
    }

    pub async fn resume(&self) -> ttrpc::Result<Empty> {
        let req = ResumeRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.resume(ctx(), &req).await
    }

    pub async fn pids(&self) -> ttrpc::Result<PidsResponse> {
        let req = PidsRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.pids(ctx(), &req).await
    }

    pub async fn stats(&self) -> ttrpc::Result<StatsResponse> {
        let req = StatsRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.stats(ctx(), &req).await
    }

    pub async fn close_stdin(&self) -> ttrpc::Result<Empty> {
        let req = CloseIORequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            stdin: true,
            ..Default::default()
        };
        self.client.close_io(ctx(), &req).await
    }

    pub async fn resize(&self, width: u32, height: u32) -> ttrpc::Result<Empty> {
        let req = ResizePtyRequest {
            id: self.id.clone(),
            exec_id: self.exec_id.clone(),
            width,
            height,
            ..Default::default()
        };
        self.client.resize_pty(ctx(), &req).await
    }

    /// Update with `resources` (a `LinuxResources` in an `Any`), or none at all.
    pub async fn update(&self, resources: Option<Any>) -> ttrpc::Result<Empty> {
        let req = UpdateTaskRequest {
            id: self.id.clone(),
            resources: MessageField::from_option(resources),
            ..Default::default()
        };
        self.client.update(ctx(), &req).await
    }

    pub async fn checkpoint(&self, path: &str) -> ttrpc::Result<Empty> {
        let req = CheckpointTaskRequest {
            id: self.id.clone(),
            path: path.into(),
            ..Default::default()
        };
        self.client.checkpoint(ctx(), &req).await
    }

    pub async fn connect(&self) -> ttrpc::Result<ConnectResponse> {
        let req = ConnectRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.connect(ctx(), &req).await
    }

    pub async fn shutdown(&self) -> ttrpc::Result<Empty> {
        let req = ShutdownRequest {
            id: self.id.clone(),
            ..Default::default()
        };
        self.client.shutdown(ctx(), &req).await
    }
}
