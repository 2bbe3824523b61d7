/**
 * src/trace.ts: the W3C parser's bounds (a malformed traceparent starts a new trace, an oversized tracestate is
 * dropped), the settings from the configuration and the OTEL_ variables, tracing off (nothing recorded, the
 * incoming context passed on), and on against the stand-in collector (test/helpers/otlp.ts): spans exported with
 * their parents, a client's sampled flag not trusted, export failures logged once, and a collector that never
 * answers costing no hop and no stop past its bound.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { captureLogRecords } from './helpers/logs.js';
import { codeOfSync } from './helpers/errors.js';
import { startOtlpReceiver, type OtlpReceiver } from './helpers/otlp.js';
import { waitUntil } from './helpers/wait.js';
import {
  envTraceContext,
  parseHeaderList,
  parseTraceparent,
  startHop,
  startTracing,
  stopTracing,
  TRACE_QUEUE_MAX,
  traceContextOf,
  traceFields,
  tracingEnabled,
  tracingSettings,
  TRACESTATE_MAX_BYTES,
} from '../src/trace.js';
import { logger } from '../src/log.js';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN = '00f067aa0ba902b7';
const GOOD = `00-${TRACE}-${SPAN}-01`;

describe('traceparent and tracestate from an untrusted peer', () => {
  it('takes exactly version 00, 55 characters of lowercase hex, ids not zero', () => {
    expect(parseTraceparent(GOOD)).toEqual({ traceId: TRACE, spanId: SPAN, sampled: true });
    expect(parseTraceparent(`00-${TRACE}-${SPAN}-00`)).toMatchObject({ sampled: false });
    for (const bad of [
      `01-${TRACE}-${SPAN}-01`, // another version
      `ff-${TRACE}-${SPAN}-01`, // the forbidden version
      `00-${TRACE.toUpperCase()}-${SPAN}-01`, // upper case
      `00-${'0'.repeat(32)}-${SPAN}-01`, // zero trace id
      `00-${TRACE}-${'0'.repeat(16)}-01`, // zero span id
      `00-${TRACE}-${SPAN}-01-extra`, // longer (version 00 has exactly four fields)
      `00-${TRACE}-${SPAN}-1`, // shorter
      ` ${GOOD}`.slice(0, 55), // shifted
      `00-${TRACE}-${SPAN}-0g`,
      `${GOOD}, ${GOOD}`, // two headers joined by Node
      'x'.repeat(100_000),
      undefined,
      42,
      [GOOD],
    ]) {
      expect(parseTraceparent(bad), String(bad).slice(0, 80)).toBeUndefined();
      expect(traceContextOf({ traceparent: bad, tracestate: 'a=b' })).toBeUndefined();
    }
  });

  it('keeps a tracestate up to 512 bytes and drops a longer one (the traceparent stays)', () => {
    const at = `k=${'v'.repeat(TRACESTATE_MAX_BYTES - 2)}`;
    expect(traceContextOf({ traceparent: GOOD, tracestate: at })).toEqual({ traceparent: GOOD, tracestate: at });
    expect(traceContextOf({ traceparent: GOOD, tracestate: `${at}v` })).toEqual({ traceparent: GOOD });
    expect(traceContextOf({ traceparent: GOOD, tracestate: 'k=\u00e9' })).toEqual({ traceparent: GOOD });
    expect(traceContextOf({ traceparent: GOOD, tracestate: 'a=b\nc=d' })).toEqual({ traceparent: GOOD });
    expect(traceContextOf({ traceparent: GOOD, tracestate: 7 })).toEqual({ traceparent: GOOD });
    expect(traceFields(traceContextOf({ traceparent: GOOD, tracestate: 'a=b' }))).toEqual({ traceparent: GOOD, tracestate: 'a=b' });
    expect(traceFields(undefined)).toEqual({});
  });

  it('continues TRACEPARENT of a CLI environment, and ignores a bad one', () => {
    expect(envTraceContext({ TRACEPARENT: GOOD, TRACESTATE: 'a=b' })).toEqual({ traceparent: GOOD, tracestate: 'a=b' });
    expect(envTraceContext({ TRACEPARENT: 'nonsense' })).toBeUndefined();
    expect(envTraceContext({})).toBeUndefined();
  });
});

describe('settings', () => {
  const none = { otlp_endpoint: undefined, sample_ratio: undefined, headers: undefined };

  it('is off without an endpoint, and with OTEL_TRACES_EXPORTER=none whatever else says', () => {
    expect(tracingSettings(none, {}, 'gateway')).toBeUndefined();
    expect(tracingSettings({ ...none, otlp_endpoint: 'http://c:4318/v1/traces' }, { OTEL_TRACES_EXPORTER: 'none' }, 'gateway')).toBeUndefined();
  });

  it('takes the configuration first, then the standard variables', () => {
    expect(tracingSettings({ otlp_endpoint: 'http://c:4318/v1/traces', sample_ratio: 0.25, headers: 'x-api-key=a%2Cb' }, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://other:4318' }, 'gateway')).toEqual({
      url: 'http://c:4318/v1/traces',
      sampleRatio: 0.25,
      headers: { 'x-api-key': 'a,b' },
      serviceName: 'gateway',
    });
    expect(tracingSettings(none, { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318/', OTEL_TRACES_SAMPLER_ARG: '0.5', OTEL_EXPORTER_OTLP_HEADERS: 'a=1' }, 'gwsh')).toEqual({
      url: 'http://c:4318/v1/traces',
      sampleRatio: 0.5,
      headers: { a: '1' },
      serviceName: 'gwsh',
    });
    expect(tracingSettings(undefined, { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://c/t', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318' }, 'gwsh')?.url).toBe('https://c/t');
    expect(tracingSettings(undefined, { OTEL_TRACES_EXPORTER: 'otlp' }, 'gwsh')).toMatchObject({ url: 'http://localhost:4318/v1/traces', sampleRatio: 1 });
  });

  it('refuses what it cannot use with GW_ERR_TRACE_SETTINGS', () => {
    for (const env of [{ OTEL_TRACES_EXPORTER: 'console' }, { OTEL_EXPORTER_OTLP_ENDPOINT: 'ftp://c' }, { OTEL_EXPORTER_OTLP_ENDPOINT: 'not a url' }, { OTEL_TRACES_EXPORTER: 'otlp', OTEL_TRACES_SAMPLER_ARG: '2' }, { OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_HEADERS: 'novalue' }]) {
      expect(codeOfSync(() => tracingSettings(undefined, env, 'gwsh')), JSON.stringify(env)).toBe('GW_ERR_TRACE_SETTINGS');
    }
    expect(codeOfSync(() => parseHeaderList('a=%zz'))).toBe('GW_ERR_TRACE_SETTINGS');
  });
});

describe('hops', () => {
  let receiver: OtlpReceiver | undefined;
  afterEach(async () => {
    await stopTracing();
    await receiver?.close();
    receiver = undefined;
  });

  it('off: records nothing, loads no SDK, and passes the incoming context on unchanged', () => {
    expect(tracingEnabled()).toBe(false);
    const root = startHop('x', { kind: 'server' });
    expect(root.context).toBeUndefined();
    const carried = startHop('x', { kind: 'server', parent: { traceparent: GOOD, tracestate: 'a=b' } });
    expect(carried.context).toEqual({ traceparent: GOOD, tracestate: 'a=b' });
    carried.set({ a: 1 });
    carried.fail('GW_ERR_INTERNAL');
    carried.end();
  });

  it('on: a chain of hops reaches the collector with one trace id and each parent', async () => {
    receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test', resource: { 'gateway.nodename': 'n1' } });
    const client = startHop('gwsh.connect', { kind: 'client', attributes: { 'gateway.route': 'gateway-proxy-ssh', dropped: undefined } });
    const proxy = startHop('proxy.access', { kind: 'server', parent: client.context });
    const agent = startHop('agent.dial', { kind: 'server', parent: proxy.context, trusted: true });
    agent.fail('GW_ERR_TUNNEL_DIAL_FAILED');
    for (const h of [agent, proxy, client]) h.end();
    await waitUntil('three spans exported', () => receiver!.spans.length >= 3, 20_000, 100);
    const byName = Object.fromEntries(receiver.spans.map((s) => [s.name, s]));
    const [c, p, a] = [byName['gwsh.connect']!, byName['proxy.access']!, byName['agent.dial']!];
    expect(new Set([c.traceId, p.traceId, a.traceId]).size).toBe(1);
    expect(c.parentSpanId).toBe('');
    expect(p.parentSpanId).toBe(c.spanId);
    expect(a.parentSpanId).toBe(p.spanId);
    expect(c.attributes).toEqual({ 'gateway.route': 'gateway-proxy-ssh' });
    expect([c.kind, p.kind]).toEqual([3, 2]);
    expect(a).toMatchObject({ status: 2, attributes: { 'gateway.error.code': 'GW_ERR_TUNNEL_DIAL_FAILED' } });
    expect(c.resource).toMatchObject({ 'service.name': 'test', 'gateway.nodename': 'n1' });
    expect(client.context?.traceparent).toBe(`00-${c.traceId}-${c.spanId}-01`);
  });

  it("a client's sampled flag does not force sampling: the ratio decides; a cluster member's flag is followed", async () => {
    receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 0, headers: {}, serviceName: 'test' });
    const fromClient = startHop('proxy.access', { kind: 'server', parent: { traceparent: GOOD } });
    // The trace goes on (its id), unsampled: the hops after it record nothing either.
    expect(fromClient.context?.traceparent).toMatch(new RegExp(`^00-${TRACE}-[0-9a-f]{16}-00$`));
    fromClient.end();
    const fromProxy = startHop('agent.dial', { kind: 'server', parent: { traceparent: GOOD }, trusted: true });
    expect(fromProxy.context?.traceparent).toMatch(/-01$/);
    fromProxy.end();
    await waitUntil('the trusted hop exported', () => receiver!.spans.length >= 1, 20_000, 100);
    expect(receiver.spans.map((s) => s.name)).toEqual(['agent.dial']);
  });

  it('a malformed incoming traceparent starts a new trace', async () => {
    receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test' });
    const hop = startHop('proxy.access', { kind: 'server', parent: traceContextOf({ traceparent: `00-${'0'.repeat(32)}-${SPAN}-01` }) });
    hop.end();
    await waitUntil('exported', () => receiver!.spans.length >= 1, 20_000, 100);
    expect(receiver.spans[0]!.parentSpanId).toBe('');
    expect(receiver.spans[0]!.traceId).not.toBe(TRACE);
  });

  it('export failures are logged once, not per span or per batch', async () => {
    receiver = await startOtlpReceiver('fail');
    const records = captureLogRecords();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: { 'x-api-key': 'secret-key-value' }, serviceName: 'test' });
    for (let batch = 0; batch < 3; batch++) {
      for (let i = 0; i < 20; i++) startHop('h', { kind: 'internal' }).end();
      const before = receiver.requests();
      await waitUntil('the batch was tried', () => receiver!.requests() > before, 20_000, 100);
    }
    await waitUntil('the failures reported', () => records.some((r) => r.code === 'GW_ERR_TRACE_EXPORT'), 20_000, 100);
    expect(records.filter((r) => r.code === 'GW_ERR_TRACE_EXPORT')).toHaveLength(1);
    expect(JSON.stringify(records)).not.toContain('secret-key-value');
  });

  it('a collector that never answers costs no hop, drops what is past the queue, and stop() returns', async () => {
    receiver = await startOtlpReceiver('hang');
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test' }, logger('trace-test'));
    // Twice the queue: every hop starts and ends at once (nothing waits on the export); the excess is dropped.
    for (let i = 0; i < 2 * TRACE_QUEUE_MAX; i++) {
      const h = startHop('h', { kind: 'internal', parent: { traceparent: GOOD }, trusted: true });
      expect(h.context).toBeDefined();
      h.end();
    }
    await waitUntil('an export is under way', () => receiver!.requests() > 0, 20_000, 100);
    await stopTracing();
    expect(tracingEnabled()).toBe(false);
  });
});

describe('the SDK in one place, loaded only when on', () => {
  const files = (dir: string): string[] => readdirSync(dir).flatMap((n) => (statSync(join(dir, n)).isDirectory() ? files(join(dir, n)) : n.endsWith('.ts') ? [join(dir, n)] : []));

  it('only src/trace.ts names OpenTelemetry, and it imports the packages statically as types only', () => {
    const naming = files('src').filter((f) => readFileSync(f, 'utf8').includes('@opentelemetry/'));
    expect(naming).toEqual([join('src', 'trace.ts')]);
    const text = readFileSync(join('src', 'trace.ts'), 'utf8');
    const staticImports = text.split('\n').filter((l) => /^import\s/.test(l) && l.includes('@opentelemetry/'));
    expect(staticImports.length).toBeGreaterThan(0);
    for (const line of staticImports) expect(line).toMatch(/^import type /);
  });
});
