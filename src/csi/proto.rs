//! The CSI protocol's messages this plugin serves, written by hand from the spec's `csi.proto`
//! (container-storage-interface/spec v1.x, package `csi.v1`) with prost's derive: the same field
//! numbers and types, so that kubelet's generated code reads them; no `protoc` in the build. Only
//! the messages of the calls served (Identity: GetPluginInfo, GetPluginCapabilities, Probe; Node:
//! NodeGetInfo, NodeGetCapabilities, NodePublishVolume, NodeUnpublishVolume); fields the plugin does
//! not read are still declared where a message carries them, so nothing is silently dropped.

use std::collections::HashMap;

/// The gRPC service names (the path of a call is `/<service>/<method>`).
pub const IDENTITY: &str = "csi.v1.Identity";
pub const NODE: &str = "csi.v1.Node";

/// `google.protobuf.BoolValue` (Probe's `ready`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

/// `PluginCapability`: only its `service` arm (`volume_expansion`, tag 2, is not offered).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    #[prost(message, optional, tag = "1")]
    pub service: Option<PluginService>,
}

/// `PluginCapability.Service`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginService {
    #[prost(enumeration = "PluginServiceType", tag = "1")]
    pub r#type: i32,
}

/// `PluginCapability.Service.Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PluginServiceType {
    Unknown = 0,
    ControllerService = 1,
    VolumeAccessibilityConstraints = 2,
    GroupControllerService = 3,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
    #[prost(message, optional, tag = "3")]
    pub accessible_topology: Option<Topology>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Topology {
    #[prost(map = "string, string", tag = "1")]
    pub segments: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<NodeServiceCapability>,
}

/// `NodeServiceCapability`: its one arm, `rpc`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeServiceCapability {
    #[prost(message, optional, tag = "1")]
    pub rpc: Option<NodeRpc>,
}

/// `NodeServiceCapability.RPC`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeRpc {
    #[prost(enumeration = "NodeRpcType", tag = "1")]
    pub r#type: i32,
}

/// `NodeServiceCapability.RPC.Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NodeRpcType {
    Unknown = 0,
    StageUnstageVolume = 1,
    GetVolumeStats = 2,
    ExpandVolume = 3,
    VolumeCondition = 4,
    SingleNodeMultiWriter = 5,
    VolumeMountGroup = 6,
}

/// `VolumeCapability`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    #[prost(oneof = "AccessType", tags = "1, 2")]
    pub access_type: Option<AccessType>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<AccessMode>,
}

/// `VolumeCapability.access_type`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AccessType {
    #[prost(message, tag = "1")]
    Block(BlockVolume),
    #[prost(message, tag = "2")]
    Mount(MountVolume),
}

/// `VolumeCapability.BlockVolume`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BlockVolume {}

/// `VolumeCapability.MountVolume`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountVolume {
    #[prost(string, tag = "1")]
    pub fs_type: String,
    #[prost(string, repeated, tag = "2")]
    pub mount_flags: Vec<String>,
    #[prost(string, tag = "3")]
    pub volume_mount_group: String,
}

/// `VolumeCapability.AccessMode`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AccessMode {
    #[prost(enumeration = "AccessModeMode", tag = "1")]
    pub mode: i32,
}

/// `VolumeCapability.AccessMode.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AccessModeMode {
    Unknown = 0,
    SingleNodeWriter = 1,
    SingleNodeReaderOnly = 2,
    MultiNodeReaderOnly = 3,
    MultiNodeSingleWriter = 4,
    MultiNodeMultiWriter = 5,
    SingleNodeSingleWriter = 6,
    SingleNodeMultiWriter = 7,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "7")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The bytes of a request as kubelet's generated code writes them (hand-encoded from the
    /// spec's field numbers) decode into the fields they name.
    #[test]
    fn field_numbers_are_the_specs() {
        // volume_id (1) = "v", target_path (4) = "/t", readonly (6) = true,
        // volume_context (8) = {"k": "x"}, volume_capability (5) = { mount (2) = {} }.
        let bytes = [
            0x0a, 1, b'v', 0x22, 2, b'/', b't', 0x2a, 2, 0x12, 0, 0x30, 1, 0x42, 6, 0x0a, 1, b'k',
            0x12, 1, b'x',
        ];
        let r = NodePublishVolumeRequest::decode(&bytes[..]).unwrap();
        assert_eq!(r.volume_id, "v");
        assert_eq!(r.target_path, "/t");
        assert!(r.readonly);
        assert_eq!(r.volume_context.get("k").map(String::as_str), Some("x"));
        assert!(matches!(
            r.volume_capability.and_then(|c| c.access_type),
            Some(AccessType::Mount(_))
        ));
        let p = ProbeResponse {
            ready: Some(BoolValue { value: true }),
        };
        assert_eq!(p.encode_to_vec(), [0x0a, 2, 0x08, 1]);
    }
}
