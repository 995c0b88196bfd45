//! The parts of the OpenAPI document that are the same for many operations, added in one
//! place so no operation can forget them: the document's header and security schemes, the
//! headers every `/api` call reads (`X-Tenant-Id`) and every call may send (`X-Request-Id`),
//! and the error answers the shared machinery can give on any `/api` call (credentials,
//! `X-Tenant-Id`, a credential's share of connections, Redis, body size and type). An
//! operation's own, more specific description of a status is kept (a 429 of its own gets the
//! connection share's added).

use std::collections::btree_map::Entry;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, Parameter, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, Response};
use utoipa::{Modify, OpenApi};

use super::error::PROBLEM_JSON;

/// The document's header; the operations come from the resource modules' routes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sluice",
        description = "Execution admission on Redis: duplicates collapse to one execution, \
            tenants stay inside their quotas, queued work waits without being mistaken for \
            dead work. Errors are RFC 9457 problem documents with a stable `code`. Every call \
            may send `X-Request-Id` (returned as is, and logged); one is made up otherwise.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    servers(
        (url = "/", description = "The server that serves this document (`/openapi.json`)")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "executions", description = "Admit, read, list, cancel and delete executions"),
        (name = "tenants", description = "The tenant registry, tenant limits and usage"),
        (name = "api-keys", description = "Tenant API keys: created and shown once, listed by id, revoked"),
        (name = "auth", description = "Who the caller is: tenant, role and key"),
        (name = "operations", description = "Health and readiness probes, metrics, dead letters and queue statistics"),
        (name = "webhooks", description = "A tenant's webhook: its terminal changes POSTed, signed (Standard Webhooks), at least once; and the log of its deliveries"),
        (name = "worker", description = "The pull API: workers in any language lease executions, keep their leases alive, hear cancels and report outcomes (a `worker` key or the platform admin)"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.description = Some(
            "A tenant API key (`sk_<key id>_<secret>`, role worker, viewer, editor or admin; the \
             tenant comes from the key; a worker key reaches only `/api/worker/*`) or the platform admin token (acts for the tenant named in \
             `X-Tenant-Id`)."
                .into(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
        let mut metrics = Http::new(HttpAuthScheme::Bearer);
        metrics.description = Some(
            "The metrics token (`--metrics-token`), for `/metrics` only; without one configured \
             `/metrics` needs no credentials."
                .into(),
        );
        components.add_security_scheme("metrics_bearer", SecurityScheme::Http(metrics));
    }
}

/// Adds what many operations share (see the module docs).
pub fn document_common(spec: &mut utoipa::openapi::OpenApi) {
    let tenant_header = header_param(
        "X-Tenant-Id",
        "The tenant the platform admin token acts for. With a tenant API key it may be omitted \
         (the key names its tenant); naming another tenant is a 403 `tenant_mismatch`.",
        Some("^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"),
    );
    let request_id = header_param(
        "X-Request-Id",
        "An id for this request, returned in `X-Request-Id` and logged with it; one is made \
         up when absent.",
        None,
    );
    for (path, item) in spec.paths.paths.iter_mut() {
        let params = item.parameters.get_or_insert_with(Vec::new);
        if path.starts_with("/api/") {
            params.push(tenant_header.clone().into());
        }
        params.push(request_id.clone().into());
        let is_api = path.starts_with("/api/");
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            optional_body(op);
            complete_responses(op, is_api);
            // The probes take no credentials: said outright (`security: []`), so a reader (and
            // `redocly lint`) cannot take a missing requirement for a forgotten one.
            op.security.get_or_insert_with(Vec::new);
        }
    }
}

/// An optional body (`request_body = Option<T>`) as clients should read it: the body may be
/// left out (`required: false`), and when sent it is `T`. utoipa writes it as a required body of
/// `oneOf [T, null]`, which would tell a generator or Schemathesis that a JSON `null` is a
/// valid body; no route takes one (`JsonBody` reads objects only).
fn optional_body(op: &mut Operation) {
    let Some(RefOr::T(body)) = op.request_body.as_mut() else {
        return;
    };
    let mut optional = false;
    for content in body.content.values_mut() {
        let RefOr::T(content) = content else {
            continue;
        };
        let Some(RefOr::T(Schema::OneOf(one_of))) = content.schema.as_ref() else {
            continue;
        };
        let is_null = |s: &RefOr<Schema>| {
            matches!(s, RefOr::T(Schema::Object(o))
                if o.schema_type == SchemaType::Type(Type::Null))
        };
        if let [inner, null] = one_of.items.as_slice()
            && is_null(null)
        {
            content.schema = Some(inner.clone());
            optional = true;
        }
    }
    if optional {
        body.required = Some(Required::False);
    }
}

/// An optional header parameter of type string.
fn header_param(name: &str, description: &str, pattern: Option<&str>) -> Parameter {
    Parameter::builder()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(pattern),
        ))
        .build()
}

/// The 429 every authenticated call may answer (`crate::server`, "Per credential").
const CONNECTION_SHARE: &str = "`key_too_many_connections` or `tenant_too_many_connections`: \
     this connection would take the API key (or its tenant, all keys together) past its share of \
     the server's connections (`--max-connections-per-key`, `--max-connections-per-tenant`). \
     Nothing was done for the request and the connection is closed after this answer; send \
     requests on the connections the key already holds";

/// Adds the error answers the shared machinery gives (when the operation does not describe
/// them itself), and the headers that go with them.
fn complete_responses(op: &mut Operation, is_api: bool) {
    let mut add = |status: &str, description: &str| {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::T(problem(description)));
    };
    if is_api {
        add(
            "400",
            "Invalid input (a path, query or header value the server refuses), including an \
             invalid `X-Tenant-Id`",
        );
        add("401", "Missing or invalid credentials");
        add(
            "403",
            "Role too weak, or `X-Tenant-Id` names another tenant than the API key's",
        );
        add(
            "503",
            "Redis unavailable, or the request's time bound passed (`request_timeout`)",
        );
    }
    if op.request_body.is_some() {
        add("413", "The body exceeds `--body-limit`");
        add("415", "The body is not sent as `application/json`");
    }
    if is_api {
        // Any authenticated call can find its credential's share of connections full, also
        // one that documents a 429 of its own: that description gets this one added.
        match op.responses.responses.entry("429".to_owned()) {
            Entry::Vacant(e) => {
                e.insert(RefOr::T(problem(CONNECTION_SHARE)));
            }
            Entry::Occupied(mut e) => {
                if let RefOr::T(own) = e.get_mut() {
                    own.description = format!("{}; or {CONNECTION_SHARE}", own.description);
                }
            }
        }
    }
    for (status, response) in op.responses.responses.iter_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        match status.as_str() {
            "401" => {
                response
                    .headers
                    .entry("WWW-Authenticate".into())
                    .or_insert_with(|| RefOr::T(string_header("`Bearer`")));
            }
            "429" | "503" => {
                response
                    .headers
                    .entry("Retry-After".into())
                    .or_insert_with(|| {
                        RefOr::T(
                            HeaderBuilder::new()
                                .schema(Some(
                                    ObjectBuilder::new()
                                        .schema_type(Type::Integer)
                                        .minimum(Some(0)),
                                ))
                                .description(Some("Seconds to wait before trying again"))
                                .build(),
                        )
                    });
            }
            _ => {}
        }
    }
}

fn string_header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .description(Some(description))
        .build()
}

/// A problem+json answer.
fn problem(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}
