//! Validates kheap's JSON against the contract in schema/: shared by the
//! root tests (real output) and the unit tests (the pure renderers).

use serde_json::Value;

/// The schema files, by name, as built into the test binary.
const SCHEMAS: [(&str, &str); 7] = [
    ("common", include_str!("../../schema/common.schema.json")),
    ("record", include_str!("../../schema/record.schema.json")),
    ("leaks", include_str!("../../schema/leaks.schema.json")),
    ("top", include_str!("../../schema/top.schema.json")),
    ("slab", include_str!("../../schema/slab.schema.json")),
    ("malloc", include_str!("../../schema/malloc.schema.json")),
    ("diff", include_str!("../../schema/diff.schema.json")),
];

fn schema(name: &str) -> Value {
    let text = SCHEMAS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no schema for kind {name:?}"))
        .1;
    serde_json::from_str(text).unwrap_or_else(|e| panic!("schema/{name}.schema.json: {e}"))
}

/// The errors of `doc` against the schema of the kind it says it is (every
/// schema is registered, so references between them resolve offline).
pub fn schema_errors(doc: &Value) -> Vec<String> {
    let Some(kind) = doc.get("kind").and_then(Value::as_str) else {
        return vec!["no \"kind\" field".into()];
    };
    let mut options = jsonschema::options();
    for (name, _) in SCHEMAS {
        let s = schema(name);
        let id = s["$id"]
            .as_str()
            .expect("every schema has an $id")
            .to_string();
        options = options.with_resource(id, jsonschema::Resource::from_contents(s).unwrap());
    }
    let validator = options
        .build(&schema(kind))
        .unwrap_or_else(|e| panic!("schema/{kind}.schema.json does not compile: {e}"));
    validator
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect()
}

/// Panics, saying every error, unless `doc` follows its kind's schema.
pub fn assert_valid(doc: &Value) {
    let errors = schema_errors(doc);
    assert!(
        errors.is_empty(),
        "{} JSON does not follow its schema:\n{}\n{doc:#}",
        doc["kind"],
        errors.join("\n")
    );
}
