/**
 * Traces: W3C trace context (traceparent, tracestate) carried from gwsh through the Proxy, peering and the tunnel
 * to the agent, one span per hop, exported with OpenTelemetry's SDK over OTLP/HTTP (JSON) when configured. The one
 * file that knows OpenTelemetry: callers start a hop with startHop() and carry its `context` on the wire (an
 * HTTP `traceparent` header, or the `traceparent` / `tracestate` fields of the route header and the DialRequest);
 * docs/operations.md, "Tracing", says what each hop records.
 *
 *   off (the default)  no SDK loaded, no tracer: startHop() returns a span that records nothing and passes a valid
 *                      incoming context on unchanged (a W3C intermediary forwards what it does not trace), so one
 *                      traced process behind an untraced one still joins the trace. Cost: one check per hop, and a
 *                      55-character parse only when a context came in.
 *   on                 startTracing() loads the SDK (dynamic import: a process with tracing off never reads it),
 *                      a TracerProvider with one BatchSpanProcessor (bounded queue: spans past it are dropped,
 *                      never held; an export bounded by a timeout) and the OTLP/HTTP exporter. Nothing on a
 *                      connection's path waits for an export: a collector that hangs costs spans, not connections.
 *                      A failed export is logged once (GW_ERR_TRACE_EXPORT), then not again until one succeeds.
 *
 * Trust. A context from outside the cluster (gwsh's route header, an HTTP request's traceparent header) gives the
 * trace its id and parent, but not its sampled flag: this process decides by its own sample_ratio on the trace id
 * (the ratio sampler is deterministic on the id, so every process with the same ratio decides the same), so a
 * client cannot make the gateway record every one of its connections. A context from inside the cluster (a
 * DialRequest from a Proxy, over mutual TLS) is followed as sent: the first hop decided for the whole trace.
 *
 * The parser is ours, not the SDK's propagator: it must run with the SDK not loaded (the pass-through above), and
 * the bounds are this file's (exactly 55 characters, version 00 only, lowercase hex, ids not all zero; a
 * tracestate over TRACESTATE_MAX_BYTES is dropped, the traceparent kept). Anything else is dropped: a new trace
 * starts.
 */
import type { Span, Tracer } from '@opentelemetry/api';
import { GatewayError, toGatewayError } from './errors.js';
import { logger, type Logger } from './log.js';

/** A trace context as it crosses a hop: the W3C header values. */
export interface TraceContext {
  traceparent: string;
  tracestate?: string;
}

/** The only traceparent length of version 00: "00-" 32 hex "-" 16 hex "-" 2 hex. */
export const TRACEPARENT_LENGTH = 55;
/** The longest tracestate carried (W3C: 512 is what every vendor must accept); a longer one is dropped. */
export const TRACESTATE_MAX_BYTES = 512;

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
/** tracestate: list members key=value, separated by commas; printable ASCII without the separators in values. */
const TRACESTATE = /^[\x20-\x7e]*$/;

export interface ParsedTraceparent {
  traceId: string;
  spanId: string;
  sampled: boolean;
}

/** A traceparent value parsed strictly, or undefined for anything else (wrong length, version, case, zero ids). */
export function parseTraceparent(value: unknown): ParsedTraceparent | undefined {
  if (typeof value !== 'string' || value.length !== TRACEPARENT_LENGTH) return undefined;
  const m = TRACEPARENT.exec(value);
  if (!m) return undefined;
  const [, traceId, spanId, flags] = m as unknown as [string, string, string, string];
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  return { traceId, spanId, sampled: (parseInt(flags, 16) & 1) === 1 };
}

/**
 * The trace context of untrusted fields (a route header, a DialRequest, HTTP headers), or undefined: a bad
 * traceparent drops both; a tracestate that is not a string of printable ASCII or is over TRACESTATE_MAX_BYTES
 * is dropped alone.
 */
export function traceContextOf(fields: { traceparent?: unknown; tracestate?: unknown } | undefined): TraceContext | undefined {
  if (!fields) return undefined;
  const traceparent = Array.isArray(fields.traceparent) ? undefined : fields.traceparent;
  if (!parseTraceparent(traceparent)) return undefined;
  const state = fields.tracestate;
  const keep = typeof state === 'string' && state !== '' && Buffer.byteLength(state) <= TRACESTATE_MAX_BYTES && TRACESTATE.test(state);
  return keep ? { traceparent: traceparent as string, tracestate: state } : { traceparent: traceparent as string };
}

/**
 * The context a CLI continues: TRACEPARENT and TRACESTATE of its environment (as several CLIs and CI systems set
 * them), validated like any other; undefined without them.
 */
export function envTraceContext(env: Record<string, string | undefined> = process.env): TraceContext | undefined {
  return env.TRACEPARENT === undefined ? undefined : traceContextOf({ traceparent: env.TRACEPARENT.trim(), tracestate: env.TRACESTATE?.trim() });
}

/** The wire fields of a context (spread into a route header or a DialRequest); {} without one. */
export function traceFields(context: TraceContext | undefined): { traceparent?: string; tracestate?: string } {
  if (!context) return {};
  return context.tracestate ? { traceparent: context.traceparent, tracestate: context.tracestate } : { traceparent: context.traceparent };
}

export type AttributeValue = string | number | boolean;
export type Attributes = Record<string, AttributeValue | undefined>;

/** One hop's span. */
export interface HopSpan {
  /** What the next hop carries: this span's context (on), or the incoming one passed on (off). */
  readonly context: TraceContext | undefined;
  /** Adds attributes (undefined values are left out). */
  set(attributes: Attributes): void;
  /** Marks the span failed with a gateway error code (never the message: it may name a user or an address). */
  fail(code: string): void;
  /** Ends the span; later calls do nothing. */
  end(): void;
}

export interface HopOptions {
  kind: 'server' | 'client' | 'internal';
  /** The incoming context; `trusted` when it came from inside the cluster (see the top of this file). */
  parent?: TraceContext | undefined;
  trusted?: boolean;
  attributes?: Attributes;
}

/** Where spans go and how many are kept; see tracingSettings. */
export interface TracingSettings {
  /** The OTLP/HTTP traces URL (…/v1/traces). */
  url: string;
  /** 0..1: the share of new traces (and of traces a client started) that are recorded. */
  sampleRatio: number;
  /** Sent with every export (an API key of the collector's); never logged. */
  headers: Record<string, string>;
  /** The resource's service.name: gateway, gwsh. */
  serviceName: string;
  /** More resource attributes (gateway.nodename, gateway.roles). */
  resource?: Record<string, string>;
  /**
   * How long an ended span may wait to be batched with others (default TRACE_EXPORT_DELAY_MS). gwsh says 0: as
   * OpenSSH's ProxyCommand it is killed when the session ends, which may be before a second has passed.
   */
  exportDelayMs?: number;
}

/** What the configuration file says (gateway.tracing); undefined fields fall back to the environment. */
export interface TracingConfig {
  readonly otlp_endpoint: string | undefined;
  readonly sample_ratio: number | undefined;
  readonly headers: string | undefined;
}

/** An environment variable or a header list that cannot be used (GW_ERR_TRACE_SETTINGS). */
export class TracingSettingsError extends GatewayError {
  constructor(message: string) {
    super('GW_ERR_TRACE_SETTINGS', message);
  }
}

/**
 * Whether to trace, and where to: the configuration's gateway.tracing first, then the standard variables.
 * OTEL_TRACES_EXPORTER=none turns tracing off whatever else says; otherwise an endpoint turns it on:
 * otlp_endpoint or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as the traces URL itself, OTEL_EXPORTER_OTLP_ENDPOINT as a
 * base URL (v1/traces appended), as the OpenTelemetry specification defines them. OTEL_TRACES_EXPORTER=otlp
 * alone means the specification's default, http://localhost:4318/v1/traces. Headers: the configuration's or
 * OTEL_EXPORTER_OTLP_(TRACES_)HEADERS, "key=value,key2=value2" (values percent-decoded). The ratio: the
 * configuration's, else OTEL_TRACES_SAMPLER_ARG, else 1.
 */
export function tracingSettings(config: TracingConfig | undefined, env: Record<string, string | undefined>, serviceName: string): TracingSettings | undefined {
  const exporter = env.OTEL_TRACES_EXPORTER?.trim().toLowerCase();
  if (exporter === 'none') return undefined;
  if (exporter !== undefined && exporter !== '' && exporter !== 'otlp') {
    throw new TracingSettingsError(`OTEL_TRACES_EXPORTER=${exporter.slice(0, 32)}: only otlp (OTLP over HTTP) and none are supported`);
  }
  const url = config?.otlp_endpoint ?? envUrl(env) ?? (exporter === 'otlp' ? 'http://localhost:4318/v1/traces' : undefined);
  if (url === undefined) return undefined;
  checkUrl(url);
  const headerText = config?.headers ?? env.OTEL_EXPORTER_OTLP_TRACES_HEADERS ?? env.OTEL_EXPORTER_OTLP_HEADERS;
  return { url, sampleRatio: config?.sample_ratio ?? envRatio(env), headers: parseHeaderList(headerText ?? ''), serviceName };
}

function envUrl(env: Record<string, string | undefined>): string | undefined {
  const traces = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  if (traces) return traces;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (base) return `${base.replace(/\/+$/, '')}/v1/traces`;
  return undefined;
}

function envRatio(env: Record<string, string | undefined>): number {
  const arg = env.OTEL_TRACES_SAMPLER_ARG?.trim();
  if (!arg) return 1;
  const ratio = Number(arg);
  if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1) throw new TracingSettingsError(`OTEL_TRACES_SAMPLER_ARG=${arg.slice(0, 32)} is not a ratio between 0 and 1`);
  return ratio;
}

function checkUrl(url: string): void {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new TracingSettingsError('the OTLP endpoint is not a URL');
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new TracingSettingsError(`the OTLP endpoint must be http:// or https://, not ${parsed.protocol}`);
}

/** "key=value,key2=value2" as OTEL_EXPORTER_OTLP_HEADERS writes it (the values percent-encoded). */
export function parseHeaderList(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of text.split(',')) {
    if (item.trim() === '') continue;
    const eq = item.indexOf('=');
    const name = eq < 0 ? '' : item.slice(0, eq).trim();
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) throw new TracingSettingsError('an OTLP header is not key=value with a header name as key');
    let value: string;
    try {
      value = decodeURIComponent(item.slice(eq + 1).trim());
    } catch {
      throw new TracingSettingsError(`the OTLP header ${name} has a value that is not percent-encoded text`);
    }
    out[name.toLowerCase()] = value;
  }
  return out;
}

// --- the SDK, loaded only when tracing is on ---------------------------------------------------------------------

interface Running {
  tracer: Tracer;
  /** The API's pieces startHop needs (loaded with the SDK). */
  api: typeof import('@opentelemetry/api');
  /** Whether a trace id is sampled at this process's ratio. */
  sampledAt: (traceId: string) => boolean;
  shutdown: () => Promise<void>;
}

let running: Running | undefined;

/** The batch processor's bounds: spans queued at most, per export, how often, how long an export may take. */
export const TRACE_QUEUE_MAX = 2048;
const TRACE_BATCH_MAX = 512;
const TRACE_EXPORT_DELAY_MS = 1000;
const TRACE_EXPORT_TIMEOUT_MS = 10_000;
/** How long stopTracing waits for the last export before it gives up on it. */
export const TRACE_FLUSH_MAX_MS = 3000;

/** Whether spans are being recorded in this process. */
export function tracingEnabled(): boolean {
  return running !== undefined;
}

/** Loads the SDK and starts exporting; a second call replaces nothing (the first settings stay). */
export async function startTracing(settings: TracingSettings, log: Logger = logger('trace')): Promise<void> {
  if (running) return;
  const [api, sdk, resources, otlp] = await Promise.all([
    import('@opentelemetry/api'),
    import('@opentelemetry/sdk-trace'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/exporter-trace-otlp-http'),
  ]);
  const exporter = reportingOnce(new otlp.OTLPTraceExporter({ url: settings.url, headers: settings.headers, timeoutMillis: TRACE_EXPORT_TIMEOUT_MS }), log, settings.url);
  const ratio = new sdk.TraceIdRatioBasedSampler(settings.sampleRatio);
  const provider = new sdk.TracerProvider({
    sampler: new sdk.ParentBasedSampler({ root: ratio }),
    resource: resources.resourceFromAttributes({ 'service.name': settings.serviceName, ...settings.resource }),
    spanLimits: { attributeCountLimit: 64, attributeValueLengthLimit: 1024, eventCountLimit: 16 },
    spanProcessors: [
      new sdk.BatchSpanProcessor({
        exporter,
        maxQueueSize: TRACE_QUEUE_MAX,
        maxExportBatchSize: TRACE_BATCH_MAX,
        scheduledDelayMillis: settings.exportDelayMs ?? TRACE_EXPORT_DELAY_MS,
        exportTimeoutMillis: TRACE_EXPORT_TIMEOUT_MS,
      }),
    ],
  });
  const sampledAt = (traceId: string) => ratio.shouldSample(api.ROOT_CONTEXT, traceId).decision === sdk.SamplingDecision.RECORD_AND_SAMPLED;
  running = { tracer: provider.getTracer('gateway'), api, sampledAt, shutdown: () => provider.shutdown() };
  log.info({ endpoint: redactedUrl(settings.url), sample_ratio: settings.sampleRatio }, 'tracing on: spans exported over OTLP/HTTP');
}

/** Exports what is queued (at most TRACE_FLUSH_MAX_MS) and stops; tracing is off afterwards. */
export async function stopTracing(): Promise<void> {
  const r = running;
  running = undefined;
  if (!r) return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([r.shutdown().catch(() => undefined), new Promise<void>((resolve) => (timer = setTimeout(resolve, TRACE_FLUSH_MAX_MS)))]);
  clearTimeout(timer);
}

type Exporter = import('@opentelemetry/sdk-trace').SpanExporter;

/** The exporter, with its failures logged once until an export succeeds again (never per span, never per batch). */
function reportingOnce(inner: Exporter, log: Logger, url: string): Exporter {
  let failing = false;
  return {
    export(spans, done) {
      inner.export(spans, (result) => {
        if (result.code === 0) {
          if (failing) log.info({ endpoint: redactedUrl(url) }, 'OTLP export works again');
          failing = false;
        } else if (!failing) {
          failing = true;
          log.warn(
            { code: 'GW_ERR_TRACE_EXPORT', endpoint: redactedUrl(url), err: result.error?.message?.slice(0, 200) },
            'cannot export spans to the OTLP endpoint; spans are dropped until it answers (logged once)',
          );
        }
        done(result);
      });
    },
    shutdown: () => inner.shutdown(),
    ...(inner.forceFlush ? { forceFlush: () => inner.forceFlush!() } : {}),
  };
}

/** The endpoint as logged: no user or password, no query (a key may sit there). */
function redactedUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return '(not a URL)';
  }
}

// --- spans ------------------------------------------------------------------------------------------------------

const NOOP: HopSpan = Object.freeze({ context: undefined, set() {}, fail() {}, end() {} });

/** A hop that records nothing and passes the incoming context on (tracing off). */
function passThrough(parent: TraceContext | undefined): HopSpan {
  return parent ? { context: parent, set() {}, fail() {}, end() {} } : NOOP;
}

/**
 * Runs a hop's work (its dial) under the hop's span: the span ends when the work settles, marked failed with the
 * error's stable code when it throws. Every hop that dials has this shape (the Proxy's routes, peering).
 */
export async function withinHop<T>(hop: HopSpan, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (err) {
    hop.fail(toGatewayError(err).code);
    throw err;
  } finally {
    hop.end();
  }
}

/**
 * Starts one hop's span, a child of parent (a context already validated with traceContextOf), or the root of a
 * new trace. With tracing off it records nothing (see the top of this file).
 */
export function startHop(name: string, options: HopOptions): HopSpan {
  const r = running;
  if (!r) return passThrough(options.parent);
  const { api } = r;
  let ctx = api.ROOT_CONTEXT;
  const parsed = options.parent ? parseTraceparent(options.parent.traceparent) : undefined;
  if (parsed && options.parent) {
    const sampled = options.trusted ? parsed.sampled : r.sampledAt(parsed.traceId);
    ctx = api.trace.setSpanContext(ctx, {
      traceId: parsed.traceId,
      spanId: parsed.spanId,
      traceFlags: sampled ? api.TraceFlags.SAMPLED : api.TraceFlags.NONE,
      isRemote: true,
      ...(options.parent.tracestate ? { traceState: api.createTraceState(options.parent.tracestate) } : {}),
    });
  }
  const kind = { server: api.SpanKind.SERVER, client: api.SpanKind.CLIENT, internal: api.SpanKind.INTERNAL }[options.kind];
  const span = r.tracer.startSpan(name, { kind, attributes: defined(options.attributes) }, ctx);
  return sdkHop(span, api);
}

function sdkHop(span: Span, api: typeof import('@opentelemetry/api')): HopSpan {
  const sc = span.spanContext();
  const state = sc.traceState?.serialize();
  const context: TraceContext = {
    traceparent: `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`,
    ...(state ? { tracestate: state } : {}),
  };
  let ended = false;
  return {
    context,
    set: (attributes) => void span.setAttributes(defined(attributes)),
    fail: (code) => {
      span.setAttribute('gateway.error.code', code);
      span.setStatus({ code: api.SpanStatusCode.ERROR, message: code });
    },
    end: () => {
      if (ended) return;
      ended = true;
      span.end();
    },
  };
}

function defined(attributes: Attributes | undefined): Record<string, AttributeValue> {
  const out: Record<string, AttributeValue> = {};
  for (const [k, v] of Object.entries(attributes ?? {})) if (v !== undefined) out[k] = v;
  return out;
}
