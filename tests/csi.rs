//! `octofs csi`, the Kubernetes CSI node plugin, driven over its socket exactly as kubelet drives it
//! (a tonic gRPC client on the Unix socket, the spec's paths and messages), without a cluster: two
//! daemons with their own state and root are two nodes, one bare repository is the project's share.
//!
//! 1. [`a_thread_moves_between_nodes_as_a_pods_volume`]: Probe, GetPluginInfo,
//!    GetPluginCapabilities, NodeGetInfo, NodeGetCapabilities, an UNIMPLEMENTED call; a publish
//!    with the ephemeral context and pod info, the same publish again (OK), a process as the pod's
//!    user in the target running git (status and log as in a clone of the upstream with the same
//!    change), the target owned by that uid; a second pod's volume of the same thread, unpublished
//!    while the first stays; the plugin restarted (its publications on disk), unpublish twice (the
//!    thread released, the share's ref is the release's snapshot); then node 2 publishes the thread
//!    and sees the file written on node 1; bad inputs answer their codes.
//! 2. [`the_manifests_are_valid_kubernetes_objects`]: every object in `deploy/kubernetes/` is
//!    deserialized into its model class of the `kubernetes` Python package, failing on unknown or
//!    missing fields (`scripts/check-k8s-manifests`).

use crate::common;

use common::*;
use octofs::csi::proto::*;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;

/// `octofs csi` for one daemon, killed (by its pid) and its targets unmounted on drop.
struct Plugin {
    child: Option<Child>,
    socket: PathBuf,
    dir: PathBuf,
    kubelet: PathBuf,
    node_id: String,
    state: PathBuf,
    root: PathBuf,
    log: PathBuf,
}

impl Plugin {
    fn start(d: &Daemon, node_id: &str) -> Plugin {
        let mut p = Plugin {
            child: None,
            socket: d.base.join("plugins/octofs/csi.sock"),
            dir: d.base.join("csi-state"),
            kubelet: d.base.join("kubelet"),
            node_id: node_id.to_string(),
            state: d.state.clone(),
            root: d.root.clone(),
            log: d.base.join("csi.log"),
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(bin())
            .env_remove("OCTOFS_STATE")
            .env_remove("OCTOFS_ROOT")
            .arg("--state")
            .arg(&self.state)
            .arg("--root")
            .arg(&self.root)
            .args(["csi", "--endpoint"])
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--node-id", &self.node_id, "--min-uid", "1", "--plugin-dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn octofs csi");
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "octofs csi did not listen within {READY_TIMEOUT:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the plugin (by its pid) and waits for it.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = wait_timeout(&mut c, Duration::from_secs(10));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The target kubelet would give a pod's inline volume.
    fn target(&self, pod_uid: &str) -> PathBuf {
        self.kubelet
            .join("pods")
            .join(pod_uid)
            .join("volumes/kubernetes.io~csi/ws/mount")
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
        umount_all_under(&self.kubelet);
    }
}

/// A kubelet-like gRPC client on the plugin's socket.
struct Kubelet {
    rt: tokio::runtime::Runtime,
    channel: tonic::transport::Channel,
}

impl Kubelet {
    fn connect(socket: &Path) -> Kubelet {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = socket.to_path_buf();
        let channel = rt
            .block_on(async move {
                tonic::transport::Endpoint::try_from("http://[::]:50051")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                        let s = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(s).await?,
                            ))
                        }
                    }))
                    .await
            })
            .expect("connect to the CSI socket");
        Kubelet { rt, channel }
    }

    fn call<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        self.rt.block_on(async move {
            tokio::time::timeout(Duration::from_secs(120), async {
                grpc.ready()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                grpc.unary(
                    tonic::Request::new(req),
                    http::uri::PathAndQuery::from_static(path),
                    tonic_prost::ProstCodec::<Req, Resp>::default(),
                )
                .await
                .map(tonic::Response::into_inner)
            })
            .await
            .unwrap_or_else(|_| panic!("{path} did not answer within 120 s"))
        })
    }

    fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), tonic::Status> {
        self.call::<_, NodePublishVolumeResponse>("/csi.v1.Node/NodePublishVolume", req)
            .map(|_| ())
    }

    fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.call::<_, NodeUnpublishVolumeResponse>(
            "/csi.v1.Node/NodeUnpublishVolume",
            NodeUnpublishVolumeRequest {
                volume_id: volume_id.into(),
                target_path: target.to_string_lossy().into_owned(),
            },
        )
        .map(|_| ())
    }
}

/// What kubelet sends for a pod's inline volume `csi: {driver: octofs.octomate.dev,
/// volumeAttributes: …}`: the ephemeral flag and the pod's info beside the attributes.
fn publish_req(
    volume_id: &str,
    target: &Path,
    pod: &str,
    attrs: &[(&str, &str)],
) -> NodePublishVolumeRequest {
    let mut ctx: HashMap<String, String> = attrs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", pod),
        ("csi.storage.k8s.io/pod.namespace", "agents"),
        ("csi.storage.k8s.io/pod.uid", volume_id),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ] {
        ctx.insert(k.into(), v.into());
    }
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: AccessModeMode::SingleNodeWriter as i32,
            }),
        }),
        volume_context: ctx,
        ..Default::default()
    }
}

#[track_caller]
fn code_of(r: Result<(), tonic::Status>, code: Code, needle: &str) {
    match r {
        Ok(()) => panic!("answered OK, expected {code:?}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{}", s.message());
            assert!(
                s.message().contains(needle) && !s.message().contains('\n'),
                "not one line naming {needle:?}: {:?}",
                s.message()
            );
        }
    }
}

/// `sh -ec script` in `dir` as `u`, its stdout.
#[track_caller]
fn sh_as(u: User, dir: &Path, script: &str) -> String {
    let mut c = as_user(u, "sh");
    c.arg("-ec").arg(script).current_dir(dir);
    let out = run(&mut c, CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str()
}

fn share_tip(share: &Path, thread: &str) -> String {
    git(
        share,
        [
            "rev-parse",
            "--verify",
            &format!("refs/octomate/threads/{thread}"),
        ],
    )
    .trim()
    .to_string()
}

#[test]
fn a_thread_moves_between_nodes_as_a_pods_volume() {
    let user = user_a();
    let h1 = Daemon::start();
    let mut h2 = Daemon::start();
    for d in [&h1, &h2] {
        open_the_way(d);
    }
    let up = GitRepo::init(&h1.base.join("upstream"));
    up.write("README.md", "# demo\n");
    up.write("src/lib.rs", "pub fn f() {}\n");
    up.commit_all("initial", DATE1);
    chmod(&h1.base.join("upstream"), 0o755);
    let share = h1.base.join("share.git");
    git(&h1.base, ["init", "-q", "--bare", share.to_str().unwrap()]);
    for d in [&h1, &h2] {
        d.cli_ok([
            "mirror",
            "add",
            "p",
            up.path.to_str().unwrap(),
            "--share",
            share.to_str().unwrap(),
        ]);
    }

    let mut p1 = Plugin::start(&h1, "node-1");
    let k1 = Kubelet::connect(&p1.socket);

    // Identity and node info, as kubelet's registration and the registrar ask them.
    let probe: ProbeResponse = k1.call("/csi.v1.Identity/Probe", ProbeRequest {}).unwrap();
    assert_eq!(probe.ready, Some(BoolValue { value: true }));
    let info: GetPluginInfoResponse = k1
        .call("/csi.v1.Identity/GetPluginInfo", GetPluginInfoRequest {})
        .unwrap();
    assert_eq!(info.name, "octofs.octomate.dev");
    assert!(!info.vendor_version.is_empty());
    let caps: GetPluginCapabilitiesResponse = k1
        .call(
            "/csi.v1.Identity/GetPluginCapabilities",
            GetPluginCapabilitiesRequest {},
        )
        .unwrap();
    assert!(caps.capabilities.is_empty(), "a node plugin only");
    let node: NodeGetInfoResponse = k1
        .call("/csi.v1.Node/NodeGetInfo", NodeGetInfoRequest {})
        .unwrap();
    assert_eq!(node.node_id, "node-1");
    let ncaps: NodeGetCapabilitiesResponse = k1
        .call(
            "/csi.v1.Node/NodeGetCapabilities",
            NodeGetCapabilitiesRequest {},
        )
        .unwrap();
    assert!(ncaps.capabilities.is_empty(), "no stage/unstage");
    let staged = k1.call::<_, ProbeResponse>("/csi.v1.Node/NodeStageVolume", ProbeRequest {});
    assert_eq!(staged.unwrap_err().code(), Code::Unimplemented);

    // Bad inputs: their codes, one line each, nothing mounted.
    let uid = user.uid.to_string();
    let attrs = [("project", "p"), ("thread", "t1"), ("uid", uid.as_str())];
    let t_bad = p1.target("pod-bad");
    code_of(
        k1.publish(NodePublishVolumeRequest {
            target_path: String::new(),
            ..publish_req("vol-bad", &t_bad, "bad", &attrs)
        }),
        Code::InvalidArgument,
        "target_path",
    );
    code_of(
        k1.publish(publish_req("", &t_bad, "bad", &attrs)),
        Code::InvalidArgument,
        "volume_id",
    );
    code_of(
        k1.publish(publish_req(
            "vol-bad",
            &t_bad,
            "bad",
            &[("project", "nope"), ("thread", "t1"), ("uid", &uid)],
        )),
        Code::NotFound,
        "nope",
    );
    code_of(
        k1.publish(publish_req(
            "vol-bad",
            &t_bad,
            "bad",
            &[("project", "p"), ("thread", "t1")],
        )),
        Code::InvalidArgument,
        "uid",
    );
    code_of(
        k1.publish(publish_req(
            "vol-bad",
            &t_bad,
            "bad",
            &[("project", "p"), ("thread", "t1"), ("uid", "0")],
        )),
        Code::PermissionDenied,
        "uid 0",
    );
    code_of(
        k1.unpublish("vol-bad", Path::new("")),
        Code::InvalidArgument,
        "target_path",
    );
    assert!(!t_bad.exists(), "a refused publish left {t_bad:?}");

    // Publish: the thread opens as the pod's user and appears at the target.
    let t1 = p1.target("pod-1");
    let t = Instant::now();
    k1.publish(publish_req("vol-1", &t1, "agent-1", &attrs))
        .unwrap();
    println!("publish (open + bind) on node 1: {:?}", t.elapsed());
    assert!(is_mounted(&t1), "{t1:?} is not a mount");
    k1.publish(publish_req("vol-1", &t1, "agent-1", &attrs))
        .expect("a second publish of the same volume and target is OK");
    let md = std::fs::metadata(&t1).unwrap();
    assert_eq!(
        md.uid(),
        user.uid,
        "the volume's root is not the pod user's"
    );
    // The same target for another volume is refused.
    code_of(
        k1.publish(publish_req("vol-other", &t1, "agent-x", &attrs)),
        Code::AlreadyExists,
        "vol-1",
    );

    // A process as the pod's user works in the volume as in a clone.
    let clone = h1.base.join("clone");
    git(
        &h1.base,
        ["clone", "-q", up.path.to_str().unwrap(), "clone"],
    );
    let change = "echo 'pub fn g() {}' >> src/lib.rs; echo hello > notes.txt";
    sh_as(user, &t1, change);
    run(
        Command::new("sh")
            .arg("-ec")
            .arg(change)
            .current_dir(&clone),
        CMD_TIMEOUT,
    )
    .assert_ok();
    // `git status` twice: with the workspace's fsmonitor hook (a process on the node, as here) and
    // without it (a pod, where the node's hook is not: docs/kubernetes.md).
    let git_says = "git status --porcelain; git -c core.fsmonitor=false status --porcelain; \
         git log --format='%H %s'; git diff --stat";
    let in_volume = sh_as(user, &t1, git_says);
    let in_clone = run(
        Command::new("sh")
            .arg("-ec")
            .arg(git_says)
            .current_dir(&clone),
        CMD_TIMEOUT,
    );
    in_clone.assert_ok();
    assert_eq!(
        in_volume,
        in_clone.stdout_str(),
        "git in the volume differs"
    );
    assert!(in_volume.contains("?? notes.txt"), "{in_volume}");
    let new_file = std::fs::metadata(t1.join("notes.txt")).unwrap();
    assert_eq!(new_file.uid(), user.uid, "a file the pod wrote");

    // A second pod of the same thread on this node; its unpublish leaves the first mounted.
    let t2 = p1.target("pod-2");
    k1.publish(publish_req("vol-2", &t2, "agent-2", &attrs))
        .unwrap();
    assert_eq!(read_ws(&t2.join("notes.txt")).unwrap(), b"hello\n");
    k1.unpublish("vol-2", &t2).unwrap();
    assert!(!t2.exists() && !is_mounted(&t2));
    assert_eq!(h1.state_of("t1"), "mounted");
    assert!(is_mounted(&t1));

    // The plugin restarts: it knows the publication from its record.
    drop(k1);
    p1.kill();
    p1.spawn();
    let k1 = Kubelet::connect(&p1.socket);
    // The node lost the bind (a reboot): the same publish mounts it again.
    umount_all_under(&t1);
    assert!(!is_mounted(&t1));
    k1.publish(publish_req("vol-1", &t1, "agent-1", &attrs))
        .unwrap();
    assert!(
        is_mounted(&t1),
        "a recorded publication was not mounted again"
    );
    assert_eq!(read_ws(&t1.join("notes.txt")).unwrap(), b"hello\n");

    // The last unpublish releases: snapshot pushed to the share.
    let t = Instant::now();
    k1.unpublish("vol-1", &t1).unwrap();
    println!(
        "unpublish (unmount + release + push) on node 1: {:?}",
        t.elapsed()
    );
    assert!(!is_mounted(&t1) && !t1.exists(), "{t1:?} left behind");
    assert_eq!(h1.state_of("t1"), "released");
    let tip = share_tip(&share, "t1");
    let shown = git(&share, ["show", &format!("{tip}:notes.txt")]);
    assert_eq!(
        shown, "hello\n",
        "the share's snapshot lacks the pod's file"
    );
    k1.unpublish("vol-1", &t1)
        .expect("a second unpublish is OK");
    k1.unpublish("vol-never", &p1.target("pod-never"))
        .expect("an unknown volume's unpublish is OK");
    let rec = std::fs::read_to_string(p1.dir.join("publications.json")).unwrap();
    assert!(!rec.contains("vol-1"), "{rec}");

    // Node 2 never saw the thread: it resumes from what node 1 pushed.
    let p2 = Plugin::start(&h2, "node-2");
    let k2 = Kubelet::connect(&p2.socket);
    let n2: NodeGetInfoResponse = k2
        .call("/csi.v1.Node/NodeGetInfo", NodeGetInfoRequest {})
        .unwrap();
    assert_eq!(n2.node_id, "node-2");
    let t3 = p2.target("pod-3");
    let t = Instant::now();
    k2.publish(publish_req("vol-3", &t3, "agent-1", &attrs))
        .unwrap();
    println!(
        "publish (share fetch + resume + bind) on node 2: {:?}",
        t.elapsed()
    );
    assert_eq!(read_ws(&t3.join("notes.txt")).unwrap(), b"hello\n");
    assert_eq!(std::fs::metadata(&t3).unwrap().uid(), user.uid);
    let on_node2 = sh_as(user, &t3, git_says);
    assert_eq!(on_node2, in_volume, "git on node 2 differs from node 1");
    // Another user's pod may not take the thread.
    let other = user_b();
    code_of(
        k2.publish(publish_req(
            "vol-4",
            &p2.target("pod-4"),
            "intruder",
            &[
                ("project", "p"),
                ("thread", "t1"),
                ("uid", &other.uid.to_string()),
            ],
        )),
        Code::PermissionDenied,
        "permission denied",
    );
    assert!(!is_mounted(&p2.target("pod-4")));
    // A read-only volume of the same thread: the pod reads, its writes are refused.
    let t5 = p2.target("pod-5");
    k2.publish(NodePublishVolumeRequest {
        readonly: true,
        ..publish_req("vol-5", &t5, "reader", &attrs)
    })
    .unwrap();
    assert_eq!(read_ws(&t5.join("notes.txt")).unwrap(), b"hello\n");
    let mut w = as_user(user, "sh");
    w.arg("-c").arg("echo x > notes.txt").current_dir(&t5);
    let refused = run(&mut w, CMD_TIMEOUT);
    assert!(
        !refused.success() && refused.stderr_str().contains("Read-only"),
        "{}",
        refused.describe()
    );
    k2.unpublish("vol-5", &t5).unwrap();
    assert_eq!(
        h2.state_of("t1"),
        "mounted",
        "the read-write pod is still there"
    );
    sh_as(user, &t3, "echo 'from node 2' > node2.txt");
    k2.unpublish("vol-3", &t3).unwrap();
    assert_eq!(h2.state_of("t1"), "released");
    let tip = share_tip(&share, "t1");
    assert_eq!(
        git(&share, ["show", &format!("{tip}:node2.txt")]),
        "from node 2\n",
        "node 2's release did not push"
    );

    // The plugin's record lost (its directory wiped): the bind is still recognised as a
    // workspace of this node's daemon and taken away; the thread stays open (no record says
    // whose it was to release) until a release or the sweep.
    let t7 = p2.target("pod-7");
    k2.publish(publish_req("vol-7", &t7, "agent-7", &attrs))
        .unwrap();
    std::fs::remove_file(p2.dir.join("publications.json")).unwrap();
    k2.unpublish("vol-7", &t7).unwrap();
    assert!(!is_mounted(&t7) && !t7.exists(), "{t7:?} left behind");
    assert_eq!(h2.state_of("t1"), "mounted");

    // Probe follows the daemon.
    h2.stop();
    let probe: ProbeResponse = k2.call("/csi.v1.Identity/Probe", ProbeRequest {}).unwrap();
    assert_eq!(probe.ready, Some(BoolValue { value: false }));
    code_of(
        k2.publish(publish_req("vol-6", &p2.target("pod-6"), "late", &attrs)),
        Code::Unavailable,
        "daemon",
    );
}

#[test]
fn the_manifests_are_valid_kubernetes_objects() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(
        Command::new("python3")
            .arg(root.join("scripts/check-k8s-manifests"))
            .arg(root.join("deploy/kubernetes")),
        Duration::from_secs(120),
    );
    assert!(out.success(), "{}", out.describe());
    let said = out.stdout_str();
    for kind in ["CSIDriver", "DaemonSet", "ServiceAccount", "Pod"] {
        assert!(said.contains(kind), "no {kind} checked: {said}");
    }
}
