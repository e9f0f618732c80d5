//! The ADS service on the wire: requests decoded by prost, responses written from the views
//! every stream of a node class shares ([`Encoded`]), with only the nonce per stream.
//!
//! The generated server encodes a `DiscoveryResponse` per stream, from resources cloned per
//! stream, into a buffer each stream keeps. Here a response is the shared bytes of its view
//! (`version_info`, `resources`, `type_url`) and a few bytes of its own (`nonce`,
//! `control_plane`): what prost would encode, field for field. A stream's ready responses go
//! out as one HTTP/2 data frame, copied into a buffer freed once written; a view larger than
//! [`COPY_LIMIT`] is not copied but sent as a frame of its own, shared by every stream.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::Frame;
use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::codegen::{http, Body, Service, StdError};
use tonic::metadata::GRPC_CONTENT_TYPE;

use super::*;

/// The gRPC method served.
const STREAM_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The largest request accepted (as the generated server was configured).
const MAX_REQUEST: usize = 64 << 20;

/// Views up to this size are copied into a stream's frame; larger ones are sent as a frame of
/// their own, shared (a frame costs a write of its own).
const COPY_LIMIT: usize = 16 << 10;

/// A stream's decoding buffer to begin with (tonic's default is 8 KiB per stream); it grows
/// for a larger request (Envoy's first, with its node, is a few KiB).
const REQUEST_BUFFER: usize = 1024;

/// One response: a view and the stream's nonce.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) encoded: Arc<Encoded>,
    pub(crate) stream: u64,
    pub(crate) nonce: u64,
}

impl Outgoing {
    /// Fields 5 (`nonce`: `"{stream}-{counter}"`) and 6 (`control_plane`).
    fn tail(&self, out: &mut BytesMut) {
        use std::fmt::Write;
        let mut nonce = NonceText::default();
        let _ = write!(nonce, "{}-{}", self.stream, self.nonce);
        out.put_u8(5 << 3 | 2);
        put_len(out, nonce.len);
        out.put_slice(&nonce.buf[..nonce.len]);
        out.put_slice(control_plane());
    }

    /// Appends the message, framed as gRPC (no compression), to `out`; a view larger than
    /// [`COPY_LIMIT`] is pushed to `frames` shared, between what `out` held and the rest.
    fn write(&self, out: &mut BytesMut, frames: &mut VecDeque<Bytes>) {
        let mut tail = BytesMut::with_capacity(48);
        self.tail(&mut tail);
        let len = self.encoded.fields.len() + tail.len();
        out.put_u8(0);
        out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        if self.encoded.fields.len() <= COPY_LIMIT {
            out.put_slice(&self.encoded.fields);
        } else {
            frames.push_back(out.split().freeze());
            frames.push_back(self.encoded.fields.clone());
        }
        out.put_slice(&tail);
    }

    /// The message as prost decodes it (for the generated service).
    pub(crate) fn decoded(&self) -> DiscoveryResponse {
        let mut out = BytesMut::new();
        let mut frames = VecDeque::new();
        self.write(&mut out, &mut frames);
        frames.push_back(out.freeze());
        let mut message: Vec<u8> = frames.iter().flat_map(|b| b.iter().copied()).collect();
        message.drain(..5);
        DiscoveryResponse::decode(message.as_slice()).unwrap_or_default()
    }
}

/// A nonce's text, on the stack (two u64 and a dash: at most 41 bytes).
struct NonceText {
    buf: [u8; 48],
    len: usize,
}

impl Default for NonceText {
    fn default() -> Self {
        NonceText {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl std::fmt::Write for NonceText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn put_len(out: &mut BytesMut, len: usize) {
    let _ = prost::encode_length_delimiter(len, out);
}

/// Field 6 (`control_plane`) of every response, encoded.
fn control_plane() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        DiscoveryResponse {
            control_plane: Some(ControlPlane {
                identifier: CONTROL_PLANE.to_string(),
            }),
            ..Default::default()
        }
        .encode_to_vec()
    })
}

/// What the generated service answers to Delta xDS.
pub(super) fn delta_unimplemented() -> GrpcStatus {
    GrpcStatus::unimplemented(
        "respway-xds serves state-of-the-world ADS only (StreamAggregatedResources)",
    )
}

impl Outbound for Result<Outgoing, Box<GrpcStatus>> {
    fn response(o: Outgoing) -> Self {
        Ok(o)
    }

    fn error(status: GrpcStatus) -> Self {
        Err(Box::new(status))
    }
}

/// Decodes a stream's requests with prost, from a small buffer.
struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = DiscoveryRequest;
    type Error = GrpcStatus;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<DiscoveryRequest>, GrpcStatus> {
        DiscoveryRequest::decode(buf)
            .map(Some)
            .map_err(|e| GrpcStatus::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(REQUEST_BUFFER, 32 << 10)
    }
}

/// A stream's response body: its responses as they come, then the trailers (`grpc-status`).
struct ResponseBody {
    rx: mpsc::Receiver<Result<Outgoing, Box<GrpcStatus>>>,
    /// Frames made and not yet given out.
    frames: VecDeque<Bytes>,
    /// Set when the stream ended: the trailers to send.
    end: Option<GrpcStatus>,
    done: bool,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = GrpcStatus;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, GrpcStatus>>> {
        let this = &mut *self;
        loop {
            if let Some(data) = this.frames.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(status) = this.end.take() {
                this.done = true;
                let mut trailers = http::HeaderMap::new();
                return Poll::Ready(Some(match status.add_header(&mut trailers) {
                    Ok(()) => Ok(Frame::trailers(trailers)),
                    Err(e) => Err(e),
                }));
            }
            // Every response ready now, in one frame (e.g. the CDS, EDS and LDS of one push).
            let mut out = BytesMut::new();
            loop {
                match this.rx.poll_recv(cx) {
                    Poll::Ready(Some(Ok(o))) => {
                        out.reserve(5 + o.encoded.fields.len().min(COPY_LIMIT) + 64);
                        o.write(&mut out, &mut this.frames);
                    }
                    Poll::Ready(Some(Err(status))) => {
                        this.end = Some(*status);
                        break;
                    }
                    Poll::Ready(None) => {
                        this.end = Some(GrpcStatus::ok(""));
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if !out.is_empty() {
                this.frames.push_back(out.freeze());
            }
            if this.frames.is_empty() && this.end.is_none() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The ADS service as [`Server::serve`] runs it: the generated service's routes and statuses,
/// with responses written from the shared views (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct AdsServer {
    pub(crate) ads: Arc<Ads>,
}

impl Server {
    /// The ADS service [`Server::serve`] runs; its streams end when `stop` changes or its
    /// sender is dropped. Unlike [`Server::ads_service`] (the generated service), it encodes a
    /// response once per node class rather than once per stream.
    pub(crate) fn ads_server(&self, stop: watch::Receiver<bool>) -> AdsServer {
        AdsServer {
            ads: Arc::new(Ads {
                cache: self.cache.clone(),
                registry: self.registry.clone(),
                security: self.security.clone(),
                stop,
                next_stream: Arc::new(AtomicU64::new(1)),
            }),
        }
    }
}

impl tonic::server::NamedService for AdsServer {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl AdsServer {
    fn stream<B>(&self, req: http::Request<B>) -> http::Response<tonic::body::Body>
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        // No compression is enabled, as with the generated service.
        if let Some(encoding) = req.headers().get("grpc-encoding") {
            if encoding.as_bytes() != b"identity" {
                let mut status = GrpcStatus::unimplemented(format!(
                    "Content is compressed with `{}` which isn't supported",
                    String::from_utf8_lossy(encoding.as_bytes())
                ));
                status.metadata_mut().insert(
                    "grpc-accept-encoding",
                    tonic::metadata::MetadataValue::from_static("identity"),
                );
                return status.into_http();
            }
        }
        let req =
            req.map(|body| Streaming::new_request(RequestDecoder, body, None, Some(MAX_REQUEST)));
        match self.ads.open(Request::from_http(req)) {
            Ok(rx) => {
                let body = ResponseBody {
                    rx,
                    frames: VecDeque::new(),
                    end: None,
                    done: false,
                };
                let mut response = http::Response::new(tonic::body::Body::new(body));
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
                response
            }
            Err(status) => status.into_http(),
        }
    }
}

impl<B> Service<http::Request<B>> for AdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let response = match req.uri().path() {
            STREAM_PATH => self.stream(req),
            DELTA_PATH => delta_unimplemented().into_http(),
            _ => {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(
                    GrpcStatus::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
                response
            }
        };
        std::future::ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::Any;

    fn view(n: usize, size: usize) -> TypeResources {
        let resources: BTreeMap<String, Any> = (0..n)
            .map(|i| {
                let any = Any {
                    type_url: ResourceType::Cluster.type_url().to_string(),
                    value: vec![i as u8; size],
                };
                (format!("c{i}"), any)
            })
            .collect();
        TypeResources::new("0123456789abcdef".to_string(), resources)
    }

    /// A response written from a shared view is the bytes prost encodes for it.
    #[test]
    fn responses_are_what_prost_encodes() {
        for (n, size) in [(0, 0), (1, 3), (8, 200), (3, COPY_LIMIT)] {
            let res = view(n, size);
            for mut names in [None, Some(Arc::new(BTreeSet::from(["c1".to_string()])))] {
                let encoded = res.encoded(ResourceType::Cluster, names.as_mut());
                let o = Outgoing {
                    encoded: encoded.clone(),
                    stream: 12,
                    nonce: 345,
                };
                let resources = match &names {
                    None => res.resources.values().cloned().collect(),
                    Some(n) => n
                        .iter()
                        .filter_map(|n| res.resources.get(n))
                        .cloned()
                        .collect(),
                };
                let expected = DiscoveryResponse {
                    version_info: res.version.clone(),
                    resources,
                    canary: false,
                    type_url: ResourceType::Cluster.type_url().to_string(),
                    nonce: "12-345".to_string(),
                    control_plane: Some(ControlPlane {
                        identifier: CONTROL_PLANE.to_string(),
                    }),
                    resource_errors: Vec::new(),
                };
                let mut out = BytesMut::new();
                let mut frames = VecDeque::new();
                o.write(&mut out, &mut frames);
                frames.push_back(out.freeze());
                let wire: Vec<u8> = frames.iter().flat_map(|b| b.iter().copied()).collect();
                let body = expected.encode_to_vec();
                assert_eq!(wire[0], 0);
                assert_eq!(&wire[1..5], &(body.len() as u32).to_be_bytes());
                assert_eq!(&wire[5..], &body[..], "{n} resources of {size} bytes");
                assert_eq!(o.decoded(), expected);
                // One view per subscription, shared, and its names with it.
                let mut same = names.as_ref().map(|n| Arc::new(BTreeSet::clone(n)));
                let again = res.encoded(ResourceType::Cluster, same.as_mut());
                assert!(Arc::ptr_eq(&encoded, &again));
                if let (Some(a), Some(b)) = (&names, &same) {
                    assert!(Arc::ptr_eq(a, b));
                }
            }
        }
    }

    #[test]
    fn nonces_are_read_back_exactly() {
        assert_eq!(nonce_counter(12, "12-345"), Some(345));
        for other in [
            "13-345", "012-345", "12-0345", "12-+345", "12-", "-345", "12345", "",
        ] {
            assert_eq!(nonce_counter(12, other), None, "{other}");
        }
        assert_eq!(nonce_counter(12, "12-99999999999999999999"), None);
    }
}
