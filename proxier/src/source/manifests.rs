//! The manifests source: Services, EndpointSlices and Nodes read from YAML or JSON files, as
//! `kubectl get -o yaml` prints them.
//!
//! A path is a file (YAML with any number of `---`-separated documents, or one JSON document)
//! or a directory, whose `*.yaml`, `*.yml` and `*.json` files are read in name order (not
//! recursively; names starting with `.` are skipped). A document may be one object or a list
//! (`kind: List`, or a typed list such as `ServiceList`, whose items may omit `kind`).
//!
//! Kept: `v1` Service, `discovery.k8s.io/v1` EndpointSlice, `v1` Node. Other kinds are ignored
//! (logged at debug level). Loading is forgiving: a document that does not parse, an object
//! without what every object has (`metadata.name`), or one that does not deserialize, becomes
//! a [`ManifestError`] naming the file, document and (when readable) the object, and the rest
//! is still loaded. A file without any object (empty, or only comments) is an error too: it is
//! most likely being written (to empty a file, remove it or write an empty `List`). A YAML document is parsed with
//! serde-saphyr into a `serde_json::Value`, then into the k8s-openapi type; a JSON file's
//! objects are deserialized straight from its text (after a look at their `apiVersion`,
//! `kind` and name), as the API source deserializes the apiserver's lists: no tree of values
//! is built or copied.

use super::SourceHandle;
use super::node_config::{Assigned, assigned_from};
use super::store::Snapshot;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// A document or object that could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    /// The file.
    pub file: PathBuf,
    /// 1-based document number in the file (`---` separated; a JSON file is document 1);
    /// `None` when the whole file is unusable (e.g. not UTF-8).
    pub document: Option<usize>,
    /// 0-based index in the document's `items` when the document is a list.
    pub item: Option<usize>,
    /// `Kind namespace/name` (or `Kind name`) of the object, when that much could be read.
    pub object: Option<String>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(document) = self.document {
            write!(f, ": document {document}")?;
        }
        if let Some(item) = self.item {
            write!(f, ", items[{item}]")?;
        }
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// Loads the manifests at `path` (a file or a directory, see the module documentation).
///
/// # Errors
/// An I/O error, with the path in its message, if `path` or a file in it cannot be read.
/// Problems with the contents are returned as [`ManifestError`]s next to what did load.
pub fn load(path: &Path) -> io::Result<(Snapshot, Vec<ManifestError>)> {
    let mut snapshot = Snapshot::default();
    let mut errors = Vec::new();
    for file in files(path)? {
        let (s, e) = load_file(&file)?;
        snapshot.extend(s);
        errors.extend(e);
    }
    Ok((snapshot, errors))
}

/// `path` with the path in an I/O error's message.
fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The files of `path`: itself, or a directory's manifests in name order.
fn files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let metadata = std::fs::metadata(path).map_err(|e| with_path(e, path))?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| with_path(e, path))? {
        let file = entry.map_err(|e| with_path(e, path))?.path();
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let wanted = !name.starts_with('.')
            && matches!(
                file.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
        if wanted && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// Loads one manifests file.
fn load_file(file: &Path) -> io::Result<(Snapshot, Vec<ManifestError>)> {
    let bytes = std::fs::read(file).map_err(|e| with_path(e, file))?;
    Ok(parse_file(file, &bytes))
}

/// Parses the contents `bytes` of the manifests file `file`.
fn parse_file(file: &Path, bytes: &[u8]) -> (Snapshot, Vec<ManifestError>) {
    let mut loader = Loader {
        file: file.to_owned(),
        ..Loader::default()
    };
    match std::str::from_utf8(bytes) {
        Ok(text) => loader.load_text(text),
        Err(e) => loader.error(None, None, None, format!("not UTF-8: {e}")),
    }
    (loader.snapshot, loader.errors)
}

/// Accumulates objects and errors while walking files and documents.
#[derive(Default)]
struct Loader {
    file: PathBuf,
    snapshot: Snapshot,
    errors: Vec<ManifestError>,
}

impl Loader {
    fn error(
        &mut self,
        document: Option<usize>,
        item: Option<usize>,
        object: Option<String>,
        message: String,
    ) {
        self.errors.push(ManifestError {
            file: self.file.clone(),
            document,
            item,
            object,
            message,
        });
    }

    fn load_text(&mut self, text: &str) {
        if is_blank_or_comments(text) {
            // A file is replaced by writing it anew: empty, it is most likely being written.
            self.error(
                None,
                None,
                None,
                "no objects (a file being written?); to remove a file's objects, remove the file \
                 or write an empty List"
                    .into(),
            );
            return;
        }
        if self.file.extension().and_then(|e| e.to_str()) == Some("json") {
            match serde_json::from_str::<&RawValue>(text) {
                Ok(raw) => self.load_json_document(raw),
                Err(e) => self.error(Some(1), None, None, format!("invalid JSON: {e}")),
            }
            return;
        }
        for (index, document) in split_documents(text).into_iter().enumerate() {
            let number = index + 1;
            let options = serde_saphyr::options! { with_snippet: false };
            match serde_saphyr::from_str_with_options::<Option<Value>>(document.text, options) {
                Ok(Some(value)) => self.load_document(number, value),
                Ok(None) => {}
                Err(_) => {
                    // Parse again with the lines before the document blanked out, so that the
                    // error's line numbers are the file's (only on this rare path).
                    let padded =
                        format!("{}{}", "\n".repeat(document.first_line - 1), document.text);
                    let options = serde_saphyr::options! { with_snippet: false };
                    let message =
                        serde_saphyr::from_str_with_options::<Option<Value>>(&padded, options)
                            .err()
                            .map_or_else(
                                || "invalid YAML".to_owned(),
                                |e| format!("invalid YAML: {e}"),
                            );
                    self.error(Some(number), None, None, message);
                }
            }
        }
    }

    /// A YAML document, parsed.
    fn load_document(&mut self, document: usize, value: Value) {
        let Value::Object(mut object) = value else {
            if !value.is_null() {
                self.load_object(document, None, Header::default(), Object::Value(value));
            }
            return;
        };
        let header = Header::of_value(&object);
        match object.remove("items") {
            Some(Value::Array(items)) if header.is_list() => {
                for (i, item) in items.into_iter().enumerate() {
                    let item_header = Header::of_any_value(&item).in_list(&header);
                    self.load_object(document, Some(i), item_header, Object::Value(item));
                }
            }
            items => {
                if let Some(items) = items {
                    object.insert("items".into(), items);
                }
                self.load_object(document, None, header, Object::Value(Value::Object(object)));
            }
        }
    }

    /// A JSON file's one document, checked to be JSON but not parsed. What the header's reader
    /// refuses (a duplicate key, `items` that are not an array) is parsed into a `Value`
    /// instead, read as a YAML document is (a duplicate key: the last value wins).
    fn load_json_document(&mut self, raw: &RawValue) {
        if raw.get().trim() == "null" {
            return;
        }
        let Some(mut header) = Header::of_json(raw) else {
            return self.load_document(1, parsed(raw));
        };
        if header.is_list()
            && let Some(items) = header.items.take()
        {
            for (i, item) in items.into_iter().enumerate() {
                let (item_header, object) = match Header::of_json(item) {
                    Some(item_header) => (item_header, Object::Json(item)),
                    None => {
                        let value = parsed(item);
                        (Header::of_any_value(&value), Object::Value(value))
                    }
                };
                self.load_object(1, Some(i), item_header.in_list(&header), object);
            }
            return;
        }
        self.load_object(1, None, header, Object::Json(raw));
    }

    fn load_object(
        &mut self,
        document: usize,
        item: Option<usize>,
        header: Header<'_>,
        object: Object<'_>,
    ) {
        if !header.is_object {
            self.error(
                Some(document),
                item,
                None,
                "not an object (expected a Kubernetes object with apiVersion and kind)".into(),
            );
            return;
        }
        let label = || Some(header.label()).filter(|l| !l.is_empty());
        let kind = match header.kind_to_load() {
            Ok(Some(kind)) => kind,
            Ok(None) => {
                tracing::debug!(
                    file = %self.file.display(),
                    document,
                    kind = header.kind.as_deref().unwrap_or_default(),
                    "ignoring object of a kind the proxier does not use"
                );
                return;
            }
            Err(message) => {
                self.error(Some(document), item, label(), message);
                return;
            }
        };
        let snapshot = &mut self.snapshot;
        let result = match kind {
            "Service" => object.typed().map(|o| snapshot.services.push(o)),
            "EndpointSlice" => object.typed().map(|o| snapshot.endpoint_slices.push(o)),
            "NodeProxyConfig" => object.typed().map(|o| snapshot.node_proxy_configs.push(o)),
            _ => object.typed().map(|o| snapshot.nodes.push(o)),
        };
        if let Err(e) = result {
            self.error(
                Some(document),
                item,
                label(),
                format!("invalid {kind}: {e}"),
            );
        }
    }
}

/// One object of a document, not yet deserialized.
enum Object<'a> {
    /// A YAML document's (parsed).
    Value(Value),
    /// A JSON file's: its text.
    Json(&'a RawValue),
}

impl Object<'_> {
    /// The object as `T`.
    fn typed<T: DeserializeOwned>(self) -> Result<T, serde_json::Error> {
        match self {
            Object::Value(value) => serde_json::from_value(value),
            Object::Json(raw) => serde_json::from_str(raw.get()),
        }
    }
}

/// What the loader looks at before deserializing an object: whether it is one, its
/// `apiVersion` and `kind` (`None` when absent, empty when not strings), its name (for errors)
/// and, in a JSON document, the text of each of its `items` (read with the header: one pass).
#[derive(Default)]
struct Header<'a> {
    is_object: bool,
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    items: Option<Vec<&'a RawValue>>,
}

/// The fields of a JSON object that [`Header`] reads (a value of another type reads as absent,
/// except `items`: one that is not an array fails the header, and the document is read as a
/// parsed tree instead, as YAML is).
#[derive(Deserialize)]
struct JsonHeader<'a> {
    #[serde(rename = "apiVersion", default, deserialize_with = "present")]
    api_version: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    kind: Option<Value>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    items: Option<Vec<&'a RawValue>>,
}

/// A field that is there, `null` included (`Option<Value>` alone reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// The fields of a JSON object's `metadata` that [`Header`] reads.
#[derive(Deserialize)]
struct JsonMetadata {
    namespace: Option<Value>,
    name: Option<Value>,
}

/// `value` when it is a string.
fn string(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

/// A field of the header: `None` when absent, empty when not a string.
fn field(value: Option<&Value>) -> Option<String> {
    value.map(|v| v.as_str().unwrap_or_default().to_owned())
}

/// JSON text already checked to be valid, parsed into a `Value`.
fn parsed(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).expect("checked to be JSON")
}

impl<'a> Header<'a> {
    /// The kind of the object if the proxier loads it (`Service`, `Node`, `EndpointSlice`,
    /// `NodeProxyConfig`), `None` for a kind it does not use; the error message when it has no
    /// kind, an apiVersion other than its kind's, or no name.
    fn kind_to_load(&self) -> Result<Option<&str>, String> {
        let api_version = self.api_version.as_deref().unwrap_or_default();
        let kind = self.kind.as_deref().unwrap_or_default();
        let expected = match kind {
            "Service" | "Node" => "v1",
            "EndpointSlice" => "discovery.k8s.io/v1",
            "NodeProxyConfig" => "kipvs.io/v1alpha1",
            "" => return Err("has no kind".into()),
            _ => return Ok(None),
        };
        if api_version != expected {
            return Err(format!(
                "apiVersion {api_version:?} is not supported for {kind} (expected {expected})"
            ));
        }
        if self.name.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "invalid {kind}: no metadata.name (every object has one: a file cut short?)"
            ));
        }
        Ok(Some(kind))
    }

    /// A parsed object's header.
    fn of_value(object: &serde_json::Map<String, Value>) -> Self {
        let metadata = object.get("metadata");
        let meta = |name: &str| string(metadata.and_then(|m| m.get(name)));
        Header {
            is_object: true,
            api_version: field(object.get("apiVersion")),
            kind: field(object.get("kind")),
            namespace: meta("namespace"),
            name: meta("name"),
            items: None,
        }
    }

    /// A parsed value's header (that of no object when it is not one).
    fn of_any_value(value: &Value) -> Self {
        value
            .as_object()
            .map_or_else(Header::default, Header::of_value)
    }

    /// A JSON object's header, read from its text (`raw` is valid JSON: it was parsed once);
    /// `None` when the reader refuses it (a duplicate key, `items` that are not an array).
    fn of_json(raw: &'a RawValue) -> Option<Self> {
        if !raw.get().trim_start().starts_with('{') {
            return Some(Header::default());
        }
        let header = serde_json::from_str::<JsonHeader<'_>>(raw.get()).ok()?;
        let metadata = header
            .metadata
            .and_then(|m| serde_json::from_str::<JsonMetadata>(m.get()).ok());
        Some(Header {
            is_object: true,
            api_version: field(header.api_version.as_ref()),
            kind: field(header.kind.as_ref()),
            namespace: metadata.as_ref().and_then(|m| string(m.namespace.as_ref())),
            name: metadata.as_ref().and_then(|m| string(m.name.as_ref())),
            items: header.items,
        })
    }

    /// Whether this is a list (`kind: List`, `ServiceList`, ...) whose items are loaded.
    fn is_list(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.ends_with("List"))
    }

    /// This item's header in `list`: a typed list (`ServiceList`) may omit its items' `kind`
    /// and `apiVersion` (absent ones are the list's; as `kubectl` reads them).
    fn in_list(mut self, list: &Header<'_>) -> Self {
        let item_kind = (list.kind.as_deref().unwrap_or_default())
            .strip_suffix("List")
            .filter(|k| !k.is_empty());
        if let (true, Some(item_kind)) = (self.is_object, item_kind) {
            self.kind.get_or_insert_with(|| item_kind.to_owned());
            if self.api_version.is_none() {
                self.api_version.clone_from(&list.api_version);
            }
        }
        self
    }

    /// `Kind namespace/name`, `Kind name`, or what of it is known.
    fn label(&self) -> String {
        let name = match (&self.namespace, &self.name) {
            (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
            (None, Some(name)) => name.clone(),
            _ => String::new(),
        };
        [self.kind.as_deref().unwrap_or_default(), &name]
            .join(" ")
            .trim()
            .to_owned()
    }
}

/// One YAML document of a stream.
#[derive(Debug, PartialEq, Eq)]
struct Document<'a> {
    /// 1-based line of the file where the document's text starts.
    first_line: usize,
    /// The document's text, without its `---` marker.
    text: &'a str,
}

/// Splits a YAML stream at document markers: a line that is `---` (or starts with `--- `)
/// begins a document, a line `...` ends one. Text before the first marker counts as a
/// document only if it holds more than blank lines and comments, so `---` at the top of a
/// file does not shift the numbering.
fn split_documents(text: &str) -> Vec<Document<'_>> {
    let mut documents = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut offset = 0;
    let mut seen_marker = false;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_start = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        let is_end = bare == "...";
        if is_start || is_end {
            let body = &text[start..offset];
            if seen_marker || !is_blank_or_comments(body) {
                documents.push(Document {
                    first_line,
                    text: body,
                });
            }
            seen_marker = true;
            // Content after `--- ` on the marker line belongs to the new document.
            start = if is_start {
                offset + 3
            } else {
                offset + line.len()
            };
            first_line = index + 1;
            if is_end {
                first_line += 1;
            }
        }
        offset += line.len();
    }
    let body = &text[start..];
    if !is_blank_or_comments(body) || (seen_marker && documents.is_empty()) {
        documents.push(Document {
            first_line,
            text: body,
        });
    }
    documents
}

fn is_blank_or_comments(text: &str) -> bool {
    text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#')
    })
}

/// The manifests source: a file or directory re-read whenever its contents change.
#[derive(Clone, Debug)]
pub struct ManifestsSource {
    /// File or directory of manifests.
    pub path: PathBuf,
    /// The node whose Node object is taken from the manifests.
    pub node_name: String,
    /// Where to publish what the manifests' NodeProxyConfig for this node assigns (`None`:
    /// NodeProxyConfigs in the manifests are not followed).
    pub node_configs: Option<watch::Sender<Assigned>>,
}

/// A manifests file and its bytes, or why they cannot be read.
type FileRead = (PathBuf, io::Result<Vec<u8>>);

/// The manifests files under `path`, each read once (for the fingerprint, and parsed if that
/// changed), and the fingerprint of their names and contents.
///
/// # Errors
/// `path` cannot be listed; a file that cannot be read is returned with its error.
fn read_files(path: &Path) -> io::Result<(u64, Vec<FileRead>)> {
    let mut hasher = DefaultHasher::new();
    let contents = files(path)?
        .into_iter()
        .map(|file| {
            let bytes = std::fs::read(&file);
            (&file, bytes.as_ref().ok()).hash(&mut hasher);
            (file, bytes)
        })
        .collect();
    Ok((hasher.finish(), contents))
}

/// Adds what `file` (read as `bytes`) loads to `snapshot`, and its content to `loaded` when it
/// loads whole; returns whether it did. A file that does not load is logged and gives its
/// `last_good` content instead if there is one, else whatever of it did load.
fn add_file(
    file: PathBuf,
    bytes: io::Result<Vec<u8>>,
    last_good: Option<&Vec<u8>>,
    loaded: &mut Loaded,
    snapshot: &mut Snapshot,
) -> bool {
    let (partial, reason) = match bytes {
        Ok(bytes) => match parse_file(&file, &bytes) {
            (s, errors) if errors.is_empty() => {
                loaded.good.insert(file, bytes);
                snapshot.extend(s);
                return true;
            }
            (s, errors) => {
                let reason: Vec<String> = errors.iter().map(ToString::to_string).collect();
                (Some(s), reason.join("; "))
            }
        },
        Err(e) => (None, with_path(e, &file).to_string()),
    };
    match last_good {
        Some(good) => {
            tracing::warn!(
                file = %file.display(),
                "keeping the file's last good content: {reason}"
            );
            // It parsed without an error before: it does again.
            snapshot.extend(parse_file(&file, good).0);
            loaded.good.insert(file, good.clone());
        }
        None => {
            tracing::warn!("skipped manifest: {reason}");
            snapshot.extend(partial.unwrap_or_default());
        }
    }
    false
}

/// How often the manifests are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

impl ManifestsSource {
    /// Load the files into the store if their contents changed since `last` (`None`: load);
    /// returns what was loaded, or `None` when nothing changed.
    ///
    /// A file that cannot be read or has a document or object that does not load (e.g. a
    /// half-written file) keeps its last good content from `last`, so bad input never deletes
    /// anything; it is logged with the reason and counted in `kipvs_manifests_invalid_files`.
    /// Without a last good content (at start) what did load is used. A file that is removed
    /// takes its objects with it.
    ///
    /// # Errors
    /// The path itself cannot be listed (the store is left unchanged).
    pub fn load_into(
        &self,
        handle: &SourceHandle,
        last: Option<&Loaded>,
    ) -> io::Result<Option<Loaded>> {
        let started = std::time::Instant::now();
        let (fingerprint, contents) = read_files(&self.path)?;
        if last.is_some_and(|l| l.fingerprint == fingerprint) {
            return Ok(None);
        }
        let mut loaded = Loaded {
            fingerprint,
            good: BTreeMap::new(),
        };
        let mut snapshot = Snapshot::default();
        let mut invalid = 0;
        for (file, bytes) in contents {
            let good = last.and_then(|l| l.good.get(&file));
            if !add_file(file, bytes, good, &mut loaded, &mut snapshot) {
                invalid += 1;
            }
        }
        handle.invalid_manifests(invalid);
        tracing::info!(
            services = snapshot.services.len(),
            endpoint_slices = snapshot.endpoint_slices.len(),
            nodes = snapshot.nodes.len(),
            invalid_files = invalid,
            duration_us = started.elapsed().as_micros() as u64,
            "loaded manifests"
        );
        if let Some(tx) = &self.node_configs {
            let next = assigned_from(&snapshot.node_proxy_configs, &self.node_name);
            tx.send_if_modified(|current| {
                let changed = *current != next;
                *current = next;
                changed
            });
        }
        handle.update(|store| store.replace_all(snapshot, &self.node_name));
        Ok(Some(loaded))
    }

    /// Poll the files every [`POLL_INTERVAL`] forever, loading changes into the store.
    pub async fn watch(self, handle: SourceHandle) {
        let mut last = None;
        loop {
            match self.load_into(&handle, last.as_ref()) {
                Ok(loaded) => {
                    if loaded.is_some() {
                        last = loaded;
                    }
                    handle.mark_ready();
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), "cannot read manifests: {e}")
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// What [`ManifestsSource::load_into`] loaded: a fingerprint of the manifests' names and
/// contents (to notice edits of any size or timestamp) and the last good
/// content of each, as the file's bytes (parsed again only when the file goes bad: the text
/// is a few times smaller than the objects it holds).
#[derive(Clone, Debug)]
pub struct Loaded {
    fingerprint: u64,
    good: BTreeMap<PathBuf, Vec<u8>>,
}

#[cfg(test)]
mod tests;
