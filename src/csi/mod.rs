//! `octofs csi`: a Kubernetes CSI node plugin (docs/kubernetes.md). It owns the gRPC endpoint kubelet
//! calls (a Unix socket), the CSI Identity service (GetPluginInfo, GetPluginCapabilities, Probe) and
//! the Node service (NodeGetInfo, NodeGetCapabilities, NodePublishVolume, NodeUnpublishVolume; every
//! other call answers UNIMPLEMENTED), and its own record of publications ([`node`]).
//!
//! It is a client of this node's octofs daemon over the control socket, never a second daemon: it
//! must not touch the daemon's state directory, a mirror or a workspace's files. A thread is opened
//! and released by `octofs open`/`release` run as the pod's user ([`node`]); the plugin itself (root,
//! like kubelet, its only caller) makes the target directory and the bind mount.
//!
//! The services are served without generated code: [`Csi`] routes a call by its path to a handler,
//! each decoded and encoded by tonic's gRPC framing with prost's codec over the hand-written
//! messages of [`proto`] (the build needs no `protoc`).

pub mod node;
pub mod proto;

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;
use tonic::server::{Grpc, UnaryService};
use tonic_prost::ProstCodec;

use node::{Config, Node};
use proto::*;

/// The driver name kubelet knows the plugin by (the `CSIDriver` object's name).
pub const DRIVER_NAME: &str = "octofs.octomate.dev";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The gRPC service: one per connection (cloned), sharing the node.
#[derive(Clone)]
pub struct Csi {
    node: Arc<Node>,
}

/// A one-shot handler as tonic's unary service.
struct Call<F, Resp>(Option<F>, PhantomData<fn() -> Resp>);

impl<Req, Resp, F, Fut> UnaryService<Req> for Call<F, Resp>
where
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Result<tonic::Response<Resp>, Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        match self.0.take() {
            Some(f) => {
                let fut = f(request.into_inner());
                Box::pin(async move { fut.await.map(tonic::Response::new) })
            }
            None => Box::pin(async { Err(Status::internal("handler called twice")) }),
        }
    }
}

/// Decodes one unary call, runs `f`, encodes its answer (or its status).
async fn unary<Req, Resp, F, Fut>(req: http::Request<Body>, f: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
{
    let mut grpc = Grpc::new(ProstCodec::<Resp, Req>::default());
    grpc.unary(Call(Some(f), PhantomData), req).await
}

/// Runs blocking node work (child processes, mounts) off the reactor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(Status::internal(format!("the handler failed: {e}"))))
}

impl Csi {
    pub fn new(node: Arc<Node>) -> Csi {
        Csi { node }
    }

    async fn route(self, req: http::Request<Body>) -> http::Response<Body> {
        let n = self.node;
        let path = req.uri().path().to_string();
        let Some((service, method)) = path.trim_start_matches('/').split_once('/') else {
            return Status::unimplemented(format!("no such call {path}")).into_http();
        };
        match (service, method) {
            (IDENTITY, "GetPluginInfo") => {
                unary(req, |_: GetPluginInfoRequest| async {
                    Ok(GetPluginInfoResponse {
                        name: DRIVER_NAME.to_string(),
                        vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                        manifest: Default::default(),
                    })
                })
                .await
            }
            // No controller service and no topology: a node plugin only.
            (IDENTITY, "GetPluginCapabilities") => {
                unary(req, |_: GetPluginCapabilitiesRequest| async {
                    Ok(GetPluginCapabilitiesResponse {
                        capabilities: vec![],
                    })
                })
                .await
            }
            (IDENTITY, "Probe") => {
                unary(req, move |_: ProbeRequest| async move {
                    let ready = blocking(move || Ok(n.daemon_ready())).await?;
                    Ok(ProbeResponse {
                        ready: Some(BoolValue { value: ready }),
                    })
                })
                .await
            }
            (NODE, "NodeGetInfo") => {
                unary(req, move |_: NodeGetInfoRequest| async move {
                    Ok(NodeGetInfoResponse {
                        node_id: n.config.node_id.clone(),
                        max_volumes_per_node: 0,
                        accessible_topology: None,
                    })
                })
                .await
            }
            // No stage/unstage, no stats, no mount group: publish and unpublish only.
            (NODE, "NodeGetCapabilities") => {
                unary(req, |_: NodeGetCapabilitiesRequest| async {
                    Ok(NodeGetCapabilitiesResponse {
                        capabilities: vec![],
                    })
                })
                .await
            }
            (NODE, "NodePublishVolume") => {
                unary(req, move |r: NodePublishVolumeRequest| async move {
                    blocking(move || n.publish(r)).await?;
                    Ok(NodePublishVolumeResponse {})
                })
                .await
            }
            (NODE, "NodeUnpublishVolume") => {
                unary(req, move |r: NodeUnpublishVolumeRequest| async move {
                    blocking(move || n.unpublish(&r.volume_id, &r.target_path)).await?;
                    Ok(NodeUnpublishVolumeResponse {})
                })
                .await
            }
            (IDENTITY | NODE, m) => {
                Status::unimplemented(format!("{m} is not offered by the octofs node plugin"))
                    .into_http()
            }
            _ => Status::unimplemented(format!("no service {service} here")).into_http(),
        }
    }
}

impl tower_service::Service<http::Request<Body>> for Csi {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { Ok(me.route(req).await) })
    }
}

/// `unix:///path/csi.sock` (or a plain absolute path) as a path.
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf, String> {
    let p = endpoint
        .strip_prefix("unix://")
        .unwrap_or(endpoint)
        .to_string();
    let p = PathBuf::from(p);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!(
            "--endpoint {endpoint:?} is not unix:///ABSOLUTE/PATH (the CSI socket)"
        ))
    }
}

/// This machine's host name (the default node id).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Serves the plugin on `endpoint` until SIGTERM or SIGINT. A stale socket file is replaced; the
/// socket is made 0600 (kubelet, root, is its only caller).
pub fn serve(config: Config, endpoint: &str) -> Result<(), String> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OCTOFS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let path = endpoint_path(endpoint)?;
    if config.node_id.is_empty() {
        return Err("no node id: give --node-id (the Kubernetes node name)".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(async move {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove the old {}: {e}", path.display())),
        }
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
        }
        let node = Arc::new(Node::new(config));
        tracing::info!(
            endpoint = %path.display(),
            node = %node.config.node_id,
            driver = DRIVER_NAME,
            publications = node.publications().map(|p| p.len()).unwrap_or(0),
            "CSI node plugin serving"
        );
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let stop = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        let r = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(Csi::new(node), incoming, stop)
            .await;
        let _ = std::fs::remove_file(&path);
        r.map_err(|e| format!("the CSI server failed: {e}"))
    })
}
