/**
 * A small OTLP/HTTP receiver that STANDS IN FOR AN OPENTELEMETRY COLLECTOR (neither the Collector nor Jaeger is
 * packaged in Debian): a node http server on 127.0.0.1 that takes POST /v1/traces with the JSON encoding of
 * ExportTraceServiceRequest (what @opentelemetry/exporter-trace-otlp-http sends), answers 200 {} and keeps every
 * span flattened with its resource's attributes. Bodies over 8 MiB are refused (413).
 *
 * Modes, for the hostile cases: `ok` (the default), `fail` (answers 500 to every export), `hang` (reads the
 * request and never answers; the sockets are destroyed at close()).
 */
import http from 'node:http';
import type net from 'node:net';

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span. */
  parentSpanId: string;
  name: string;
  /** OTLP's SpanKind number: 1 internal, 2 server, 3 client. */
  kind: number;
  attributes: Record<string, string | number | boolean>;
  /** The resource's attributes: service.name, gateway.nodename, gateway.roles. */
  resource: Record<string, string | number | boolean>;
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  status: number;
  /** The W3C tracestate the span carried ('' without one). */
  traceState: string;
}

export interface OtlpReceiver {
  /** http://127.0.0.1:PORT/v1/traces */
  readonly url: string;
  readonly spans: ReceivedSpan[];
  /** Export requests received (answered or not). */
  readonly requests: () => number;
  mode: 'ok' | 'fail' | 'hang';
  close(): Promise<void>;
}

type AnyValue = { stringValue?: string; intValue?: string | number; boolValue?: boolean; doubleValue?: number };
type KeyValue = { key: string; value: AnyValue };

/** OTLP/JSON ids are hex strings (the JSON mapping of the protobuf's bytes). */
function hexOf(id: unknown): string {
  if (typeof id === 'string') return id.toLowerCase();
  return '';
}

function valueOf(v: AnyValue): string | number | boolean {
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  return '';
}

function attributesOf(list: KeyValue[] | undefined): Record<string, string | number | boolean> {
  return Object.fromEntries((list ?? []).map((kv) => [kv.key, valueOf(kv.value)]));
}

interface ExportBody {
  resourceSpans?: Array<{
    resource?: { attributes?: KeyValue[] };
    scopeSpans?: Array<{ spans?: Array<{ traceId: string; spanId: string; parentSpanId?: string; traceState?: string; name: string; kind: number; attributes?: KeyValue[]; status?: { code?: number } }> }>;
  }>;
}

export async function startOtlpReceiver(mode: OtlpReceiver['mode'] = 'ok'): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const sockets = new Set<net.Socket>();
  let requests = 0;
  const receiver = { mode } as OtlpReceiver & { mode: OtlpReceiver['mode'] };
  const server = http.createServer((req, res) => {
    requests++;
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size <= 8 * 1024 * 1024) chunks.push(c);
    });
    req.on('end', () => {
      if (receiver.mode === 'hang') return;
      if (receiver.mode === 'fail') return void res.writeHead(500, { 'content-type': 'application/json' }).end('{"code":13,"message":"stand-in collector told to fail"}');
      if (size > 8 * 1024 * 1024) return void res.writeHead(413).end();
      if (req.method !== 'POST' || req.url !== '/v1/traces') return void res.writeHead(404).end();
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as ExportBody;
      for (const rs of body.resourceSpans ?? []) {
        const resource = attributesOf(rs.resource?.attributes);
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) {
            spans.push({ traceId: hexOf(s.traceId), spanId: hexOf(s.spanId), parentSpanId: hexOf(s.parentSpanId), name: s.name, kind: s.kind, attributes: attributesOf(s.attributes), resource, status: s.status?.code ?? 0, traceState: s.traceState ?? '' });
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return Object.assign(receiver, {
    url: `http://127.0.0.1:${port}/v1/traces`,
    spans,
    requests: () => requests,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  });
}
