//! The Task API as ttrpc serves it: each RPC handed to [`TaskService`], mutating ones as
//! tasks of their own so a client's deadline never stops them half-done.

use super::*;

/// The ttrpc-facing wrapper (the generated trait wants `Arc<dyn Task>`).
#[derive(Clone)]
pub struct Service(pub Arc<TaskService>);

/// Sets its flag when dropped while still holding it.
struct SetOnDrop(Option<Arc<AtomicBool>>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

impl Service {
    /// Runs a mutating request as a task of its own and awaits it. ttrpc drops the handler when
    /// the client's deadline passes; the spawned task still runs to its end, so no request stops
    /// half-done (a runtime call without its cleanup, a container created but never recorded).
    async fn detached<T, F>(
        &self,
        ctx: &TtrpcContext,
        rpc: &'static str,
        id: String,
        work: impl FnOnce(Arc<TaskService>) -> F,
    ) -> TResult<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, TaskError>> + Send + 'static,
    {
        let svc = self.0.clone();
        let log_id = id.clone();
        let work = work(self.0.clone());
        // The request's trace context and start time, for its events and failure line.
        let request = Request::from_metadata(&ctx.metadata);
        let task = tokio::spawn(request.scope(async move {
            let result = work.await;
            // Logged here, so a failure is on record even when the client has gone.
            result.map_err(|e| svc.fail(rpc, &log_id, e))
        }));
        match task.await {
            Ok(result) => result,
            Err(e) => Err(self
                .0
                .fail(rpc, &id, TaskError::Internal(format!("{rpc} did not finish: {e}")))),
        }
    }
}

#[async_trait]
impl Task for Service {
    async fn create(&self, ctx: &TtrpcContext, req: CreateTaskRequest) -> TResult<CreateTaskResponse> {
        let trace = Request::from_metadata(&ctx.metadata).traceparent.unwrap_or_default();
        info!(self.0.log, "create"; "id" => &req.id, "bundle" => &req.bundle, "terminal" => req.terminal,
            "traceparent" => trace);
        let id = req.id.clone();
        // Set if this handler is dropped (the client's deadline) before the work ends.
        let abandoned = Arc::new(AtomicBool::new(false));
        let mut gave_up = SetOnDrop(Some(abandoned.clone()));
        let result = self
            .detached(ctx, "create", id.clone(), |s| async move {
                let r = s.do_create(req).await;
                s.after_create(&id, r.is_ok(), &abandoned).await;
                r
            })
            .await;
        gave_up.0 = None;
        result
    }

    async fn start(&self, ctx: &TtrpcContext, req: StartRequest) -> TResult<StartResponse> {
        debug!(self.0.log, "start"; "id" => &req.id, "exec_id" => &req.exec_id);
        let id = req.id.clone();
        let started = self
            .detached(ctx, "start", id, |s| async move { s.do_start(req).await })
            .await;
        // The container now runs, usually for long: the daemon settles into its idle size.
        self.0.settle.arm();
        started
    }

    async fn delete(&self, ctx: &TtrpcContext, req: DeleteRequest) -> TResult<DeleteResponse> {
        debug!(self.0.log, "delete"; "id" => &req.id, "exec_id" => &req.exec_id);
        let id = req.id.clone();
        self.detached(ctx, "delete", id, |s| async move { s.do_delete(req).await })
            .await
    }

    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> TResult<StateResponse> {
        self.0.do_state(&req).map_err(|e| self.0.fail("state", &req.id, e))
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> TResult<WaitResponse> {
        let p = self
            .0
            .get(&req.id)
            .and_then(|c| c.process(&req.exec_id))
            .map_err(|e| self.0.fail("wait", &req.id, e))?;
        let exit = p.wait().await;
        Ok(WaitResponse {
            exit_status: exit.status,
            exited_at: ts_field(Some(exit.at)),
            ..Default::default()
        })
    }

    async fn kill(&self, ctx: &TtrpcContext, req: KillRequest) -> TResult<Empty> {
        debug!(self.0.log, "kill"; "id" => &req.id, "exec_id" => &req.exec_id, "signal" => req.signal, "all" => req.all);
        let id = req.id.clone();
        self.detached(ctx, "kill", id, |s| async move {
            let c = s.get(&req.id)?;
            c.kill(&req.exec_id, req.signal, req.all).await?;
            Ok(Empty::new())
        })
        .await
    }

    async fn exec(&self, ctx: &TtrpcContext, req: ExecProcessRequest) -> TResult<Empty> {
        debug!(self.0.log, "exec"; "id" => &req.id, "exec_id" => &req.exec_id);
        let id = req.id.clone();
        self.detached(
            ctx,
            "exec",
            id,
            |s| async move { s.do_exec(&req).map(|_| Empty::new()) },
        )
        .await
    }

    /// Detached like the mutating calls: a client that gives up must not leave `runc ps`
    /// without its timeout and reaping.
    async fn pids(&self, ctx: &TtrpcContext, req: PidsRequest) -> TResult<PidsResponse> {
        let id = req.id.clone();
        self.detached(ctx, "pids", id, |s| async move {
            let c = s.get(&req.id)?;
            let pids = c.runtime_pids().await?;
            let execs = c.exec_pids();
            Ok(PidsResponse {
                processes: pids
                    .into_iter()
                    .map(|pid| ProcessInfo {
                        pid: pid as u32,
                        info: execs.get(&pid).map(|id| process_details(id)).into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        })
        .await
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> TResult<Empty> {
        let p = self
            .0
            .get(&req.id)
            .and_then(|c| c.process(&req.exec_id))
            .map_err(|e| self.0.fail("close_io", &req.id, e))?;
        if req.stdin {
            p.io().close_stdin();
        }
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> TResult<Empty> {
        let p = self
            .0
            .get(&req.id)
            .and_then(|c| c.process(&req.exec_id))
            .map_err(|e| self.0.fail("resize_pty", &req.id, e))?;
        p.io()
            .resize(req.width, req.height)
            .map_err(|e| self.0.fail("resize_pty", &req.id, e.into()))?;
        Ok(Empty::new())
    }

    async fn pause(&self, ctx: &TtrpcContext, req: PauseRequest) -> TResult<Empty> {
        let id = req.id.clone();
        self.detached(ctx, "pause", id, |s| async move {
            let c = s.get(&req.id)?;
            c.pause().await?;
            s.publisher.publish(Event::Paused(TaskPaused {
                container_id: c.id().to_string(),
                ..Default::default()
            }));
            s.telemetry.emit(Kind::Paused, c.id(), |_| {});
            Ok(Empty::new())
        })
        .await
    }

    async fn resume(&self, ctx: &TtrpcContext, req: ResumeRequest) -> TResult<Empty> {
        let id = req.id.clone();
        self.detached(ctx, "resume", id, |s| async move {
            let c = s.get(&req.id)?;
            c.resume().await?;
            s.publisher.publish(Event::Resumed(TaskResumed {
                container_id: c.id().to_string(),
                ..Default::default()
            }));
            s.telemetry.emit(Kind::Resumed, c.id(), |_| {});
            Ok(Empty::new())
        })
        .await
    }

    async fn update(&self, ctx: &TtrpcContext, req: UpdateTaskRequest) -> TResult<Empty> {
        let id = req.id.clone();
        self.detached(ctx, "update", id, |s| async move {
            let c = s.get(&req.id)?;
            let resources = req
                .resources
                .as_ref()
                .ok_or_else(|| TaskError::InvalidArgument("update: no resources".into()))?;
            c.update(resources).await?;
            s.telemetry.emit(Kind::Updated, c.id(), |_| {});
            Ok(Empty::new())
        })
        .await
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> TResult<StatsResponse> {
        let c = self.0.get(&req.id).map_err(|e| self.0.fail("stats", &req.id, e))?;
        let stats = c.stats().await.map_err(|e| self.0.fail("stats", &req.id, e))?;
        Ok(StatsResponse {
            stats: protobuf::MessageField::some(stats),
            ..Default::default()
        })
    }

    async fn checkpoint(&self, ctx: &TtrpcContext, req: CheckpointTaskRequest) -> TResult<Empty> {
        let id = req.id.clone();
        self.detached(ctx, "checkpoint", id, |s| async move { s.do_checkpoint(req).await })
            .await
    }

    async fn connect(&self, _: &TtrpcContext, req: ConnectRequest) -> TResult<ConnectResponse> {
        let task_pid = self.0.get(&req.id).map(|c| c.init().pid() as u32).unwrap_or_default();
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> TResult<Empty> {
        let empty = self.0.is_empty();
        info!(self.0.log, "shutdown"; "id" => &req.id, "exiting" => empty);
        if empty {
            self.0.shutdown.notify_one();
        } else if self.0.containers().is_empty() {
            // Only Creates in flight: decided when they end (see `after_create`).
            self.0.shutdown_pending.store(true, Ordering::SeqCst);
        }
        Ok(Empty::new())
    }
}

/// Registers the service under both names engines call: `containerd.task.v2.Task`
/// (containerd 1.6/1.7, CRI-O) and `containerd.task.v3.Task` (containerd 2.x).
pub fn services(svc: Service) -> HashMap<String, ttrpc::r#async::Service> {
    let mut all = containerd_shim_protos::shim_async::create_task(Arc::new(svc.clone()));
    let v2 = containerd_shim_protos::shim_async::create_task(Arc::new(svc));
    for (name, service) in v2 {
        all.insert(name.replace(".v3.", ".v2."), service);
    }
    all
}
