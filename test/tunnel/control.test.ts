import { PassThrough } from 'node:stream';
import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { isGatewayError, type GatewayError } from '../../src/errors.js';
import { CHECKS_PER_INTERVAL, ControlDecoder, deadTunnelBoundMs, Heartbeat, parseControlMessage, readControl } from '../../src/tunnel/control.js';
import { CONTROL_MAX_LINE_BYTES, type ControlMessage } from '../../src/tunnel/protocol.js';

const line = (m: unknown) => `${JSON.stringify(m)}\n`;

/** One valid message of every type, as the two ends send them. */
const EXAMPLES: ControlMessage[] = [
  { type: 'hello', version: 1, hostId: 'h-1', nodename: 'web-1', services: ['ssh', 'db'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] } },
  { type: 'heartbeat', seq: 7 },
  { type: 'welcome', proxyId: 'p-1', heartbeatIntervalMs: 20_000, heartbeatCountMax: 3 },
  { type: 'discovery', proxies: [{ id: 'p-1', addr: 'proxy.example.com:443' }] },
  { type: 'reconnect', reason: 'proxy shutting down' },
  { type: 'event', event: { event: 'session.start', user: 'alice' } },
  { type: 'maintenance-changed' },
  { type: 'duplicate', proxyId: 'p-1' },
  { type: 'refused' },
  { type: 'renew', id: 1, public_key: '-----BEGIN PUBLIC KEY-----\nMFkw...\n-----END PUBLIC KEY-----\n' },
  { type: 'renew', id: 2, public_key: 'k', proof: { time: '2026-11-25T05:00:00.000Z', signature: 'MEUCIQ...' } },
  { type: 'renewal', id: 1, certs: { tls_cert: '-----BEGIN CERTIFICATE-----...', ssh_cert: 'ecdsa-sha2-nistp256-cert-v01@openssh.com AAAA...' } },
  { type: 'renewal', id: 2, error: { code: 'GW_ERR_HOST_RENEW_TOO_SOON', message: 'renewed at ...', hint: 'nothing to do' } },
  { type: 'host-cert', ssh_cert: 'ecdsa-sha2-nistp256-cert-v01@openssh.com AAAA...' },
  { type: 'presence-proof', proxyId: 'p-1', time: '2030-01-01T00:00:00.000Z', signature: 'c2ln' },
  { type: 'e2e-open', conn: 3, grant: 'eyJ2IjoxfQ.c2ln', client_src: '192.0.2.7:40000', client_dst: 'proxy.example.com:443' },
  { type: 'locks', users: ['alice', 'bob'], reason: 'lock lock-alice' },
  { type: 'locks', users: [] },
  { type: 'hello', version: 1, hostId: 'h-1', nodename: 'web-1', services: [], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] }, holds: ['p-1', 'p-2'] },
];

describe('parseControlMessage', () => {
  it.each(EXAMPLES.map((m, i) => [`${m.type} (${i})`, m]))('reads a %s message', (_type, m) => {
    expect(parseControlMessage(line(m).trimEnd())).toEqual(m);
    expect(parseControlMessage(Buffer.from(JSON.stringify(m)))).toEqual(m);
  });

  it.each([
    ['not JSON', '{"type":"heartbeat"'],
    ['a JSON array', '[{"type":"heartbeat","seq":1}]'],
    ['a JSON string', '"heartbeat"'],
    ['null', 'null'],
    ['no type', '{"seq":1}'],
    ['a type that is not a string', '{"type":7}'],
    ['an unknown type (a newer peer)', '{"type":"resources-changed","resources":{}}'],
    ['a type from the object prototype', '{"type":"toString"}'],
    ['a heartbeat without a number seq', '{"type":"heartbeat","seq":"1"}'],
    ['a welcome without intervals', '{"type":"welcome","proxyId":"p"}'],
    ['a welcome with a zero interval', '{"type":"welcome","proxyId":"p","heartbeatIntervalMs":0,"heartbeatCountMax":3}'],
    ['a discovery whose proxies are not {id, addr}', '{"type":"discovery","proxies":[{"id":1}]}'],
    ['an event that is not an object', '{"type":"event","event":[1]}'],
    ['a hello without resources', '{"type":"hello","version":1,"hostId":"h","nodename":"n","services":[]}'],
    ['a hello whose holds are not strings', '{"type":"hello","version":1,"hostId":"h","nodename":"n","services":[],"resources":{},"holds":[1]}'],
    ['a duplicate without a proxyId', '{"type":"duplicate"}'],
    ['a renew without an id', '{"type":"renew","public_key":"k"}'],
    ['a renew whose key is over 8 KiB', JSON.stringify({ type: 'renew', id: 1, public_key: 'k'.repeat(8193) })],
    ['a renew whose proof is not {time, signature} strings', '{"type":"renew","id":1,"public_key":"k","proof":{"time":1,"signature":"s"}}'],
    ['a renew whose proof signature is over 1 KiB', JSON.stringify({ type: 'renew', id: 1, public_key: 'k', proof: { time: 't', signature: 's'.repeat(1025) } })],
    ['a renewal with both certificates and an error', '{"type":"renewal","id":1,"certs":{"tls_cert":"a","ssh_cert":"b"},"error":{"code":"c","message":"m"}}'],
    ['a renewal with neither', '{"type":"renewal","id":1}'],
    ['a renewal whose certificates are not strings', '{"type":"renewal","id":1,"certs":{"tls_cert":1,"ssh_cert":"b"}}'],
    ['a renewal whose error has no message', '{"type":"renewal","id":1,"error":{"code":"c"}}'],
    ['a renewal whose error hint is not a string (it would crash a reader that slices it)', '{"type":"renewal","id":1,"error":{"code":"GW_ERR_INTERNAL","message":"m","hint":5}}'],
    ['a host-cert over 16 KiB', JSON.stringify({ type: 'host-cert', ssh_cert: 'c'.repeat(16 * 1024 + 1) })],
    ['a host-cert that is not a string', '{"type":"host-cert","ssh_cert":{}}'],
    ['a presence-proof without its signature', '{"type":"presence-proof","proxyId":"p","time":"t"}'],
    ['a presence-proof with a signature over 1 KiB', JSON.stringify({ type: 'presence-proof', proxyId: 'p', time: 't', signature: 's'.repeat(1025) })],
    ['an e2e-open with no data connection number', '{"type":"e2e-open","conn":0,"grant":"g","client_src":"a:1","client_dst":"b:2"}'],
    ['an e2e-open whose grant is over 8 KiB', JSON.stringify({ type: 'e2e-open', conn: 1, grant: 'g'.repeat(8 * 1024 + 1), client_src: 'a:1', client_dst: 'b:2' })],
    ['an e2e-open without addresses', '{"type":"e2e-open","conn":1,"grant":"g"}'],
    ['a locks whose users are not names', '{"type":"locks","users":[1]}'],
    ['a locks naming more than 1024 users', JSON.stringify({ type: 'locks', users: Array.from({ length: 1025 }, (_, i) => `u${i}`) })],
    ['a locks with an empty user name', '{"type":"locks","users":[""]}'],
  ])('ignores %s', (_what, text) => {
    expect(parseControlMessage(text)).toBeUndefined();
  });

  it('fuzz: any bytes or any JSON value give a known, well-formed message or undefined, never a throw', () => {
    const types = new Set(EXAMPLES.map((m) => m.type));
    const check = (input: string | Buffer) => {
      const m = parseControlMessage(input);
      if (m !== undefined) expect(types.has(m.type)).toBe(true);
    };
    fc.assert(fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => check(Buffer.from(bytes))), { numRuns: 300 });
    fc.assert(fc.property(fc.jsonValue(), (value) => check(JSON.stringify(value) ?? 'null')), { numRuns: 300 });
    const typed = fc.record({ type: fc.constantFrom(...types, 'other'), seq: fc.anything(), proxies: fc.anything(), event: fc.anything(), reason: fc.anything() }, { requiredKeys: ['type'] });
    fc.assert(fc.property(typed, (value) => check(JSON.stringify(value) ?? 'null')), { numRuns: 300 });
  });
});

describe('ControlDecoder', () => {
  it('gives the messages of any chunking, ignoring lines it does not know', () => {
    const text = [line(EXAMPLES[1]), 'garbage\n', line({ type: 'from-the-future' }), '\n', line(EXAMPLES[2]), line(EXAMPLES[6])].join('');
    const d = new ControlDecoder();
    const got: ControlMessage[] = [];
    for (const ch of Buffer.from(text)) got.push(...d.push(Buffer.from([ch])));
    expect(got).toEqual([EXAMPLES[1], EXAMPLES[2], EXAMPLES[6]]);
    expect(d.pending).toBe(0);
  });

  it('a line over the cap is the protocol error, even before its newline; nothing is kept', () => {
    const d = new ControlDecoder(64);
    expect(d.push(Buffer.from('{"type":"heartbeat",'))).toEqual([]);
    expect(() => d.push(Buffer.alloc(64, 0x20))).toThrow(/control line longer than 64 bytes/);
    expect(d.pending).toBe(0);
    expect(() => d.push(Buffer.from(line(EXAMPLES[1])))).toThrow(/control line longer/);
  });

  it('the default cap is CONTROL_MAX_LINE_BYTES (1 MiB)', () => {
    const d = new ControlDecoder();
    const padded = { type: 'event', event: { pad: 'x'.repeat(CONTROL_MAX_LINE_BYTES - 40) } };
    expect(d.push(Buffer.from(line(padded)))).toHaveLength(1);
    expect(() => d.push(Buffer.alloc(CONTROL_MAX_LINE_BYTES + 1, 0x20))).toThrow(/longer than 1048576 bytes/);
  });

  it('fuzz: random messages and garbage in random chunks give the valid messages in order, or only the protocol error; memory stays under the cap', () => {
    const cap = 256;
    const item = fc.oneof(
      fc.constantFrom(...EXAMPLES.filter((m) => line(m).length <= cap)).map((m) => ({ m, text: line(m) })),
      fc.string({ maxLength: 300 }).map((s) => ({ m: undefined, text: `${s.replace(/\n/g, '')}\n` })),
      fc.uint8Array({ maxLength: 300 }).map((bytes) => ({ m: undefined, text: Buffer.from(bytes).toString('latin1') })),
    );
    fc.assert(
      fc.property(fc.array(item, { maxLength: 12 }), fc.array(fc.integer({ min: 1, max: 97 }), { minLength: 1, maxLength: 8 }), (items, sizes) => {
        const all = Buffer.from(items.map((i) => i.text).join(''), 'latin1');
        const d = new ControlDecoder(cap);
        const got: ControlMessage[] = [];
        let failure: unknown;
        for (let at = 0, k = 0; at < all.length && failure === undefined; k++) {
          const size = sizes[k % sizes.length]!;
          try {
            got.push(...d.push(all.subarray(at, at + size)));
          } catch (err) {
            failure = err;
          }
          at += size;
          expect(d.pending).toBeLessThanOrEqual(cap);
        }
        // The reference: split the whole input at its newlines and parse each complete line on its own.
        const segments: Buffer[] = [];
        let start = 0;
        for (let nl = all.indexOf(0x0a); nl >= 0; nl = all.indexOf(0x0a, start)) {
          segments.push(all.subarray(start, nl));
          start = nl + 1;
        }
        const firstLong = [...segments, all.subarray(start)].findIndex((l) => l.length > cap);
        const expected = (firstLong < 0 ? segments : segments.slice(0, firstLong)).map((l) => parseControlMessage(l)).filter((m) => m !== undefined);
        if (firstLong >= 0) {
          expect(isGatewayError(failure) && failure.code === 'GW_ERR_TUNNEL_PROTOCOL').toBe(true);
          expect(expected.slice(0, got.length)).toEqual(got);
        } else {
          expect(failure).toBeUndefined();
          expect(got).toEqual(expected);
          // The valid messages that stood on their own line are among them.
          for (const it of items.filter((it, i) => it.m && (i === 0 || items[i - 1]!.text.endsWith('\n')))) expect(got).toContainEqual(it.m);
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe('readControl', () => {
  it('hands each message of the channel to onMessage, chunked as it comes', () => {
    const channel = new PassThrough();
    const got: ControlMessage[] = [];
    const errors: GatewayError[] = [];
    readControl(channel, (m) => got.push(m), (e) => errors.push(e));
    const text = line(EXAMPLES[3]) + line({ type: 'unknown' }) + line(EXAMPLES[5]);
    channel.write(text.slice(0, 10));
    channel.write(text.slice(10));
    expect(got).toEqual([EXAMPLES[3], EXAMPLES[5]]);
    expect(errors).toEqual([]);
  });

  it('a line over the cap: onError once, and the channel is no longer read', () => {
    const channel = new PassThrough();
    const got: ControlMessage[] = [];
    const errors: GatewayError[] = [];
    readControl(channel, (m) => got.push(m), (e) => errors.push(e), 32);
    channel.write('x'.repeat(40));
    channel.write(line(EXAMPLES[1]));
    channel.write('y'.repeat(40));
    expect(errors).toHaveLength(1);
    expect(errors[0]!.code).toBe('GW_ERR_TUNNEL_PROTOCOL');
    expect(got).toEqual([]);
    expect(channel.listenerCount('data')).toBe(0);
  });
});

describe('Heartbeat', () => {
  afterEach(() => vi.useRealTimers());

  function beating(intervalMs: number, silentAfterMs: number) {
    vi.useFakeTimers();
    const sent: number[] = [];
    const silent: number[] = [];
    const hb = new Heartbeat({ send: (seq) => sent.push(seq), onSilent: (ms) => silent.push(ms) });
    hb.start(intervalMs, silentAfterMs);
    return { hb, sent, silent };
  }

  it('both ends\' rule: a peer is dead after countMax intervals without a heartbeat, found within deadTunnelBoundMs, and only then', () => {
    const countMax = 3;
    const { sent, silent } = beating(1000, 1000 * countMax);
    vi.advanceTimersByTime(1000 * countMax);
    expect(sent).toEqual([1, 2, 3]);
    expect(silent).toEqual([]);
    // The silence is checked every interval / CHECKS_PER_INTERVAL: the first check past the window finds it.
    expect(deadTunnelBoundMs(1000, countMax)).toBe(1000 * countMax + 1000 / CHECKS_PER_INTERVAL);
    vi.advanceTimersByTime(deadTunnelBoundMs(1000, countMax) - 1000 * countMax);
    expect(silent).toEqual([deadTunnelBoundMs(1000, countMax)]);
    vi.advanceTimersByTime(10_000);
    expect(silent).toHaveLength(1); // once, and no more beats
    expect(sent).toEqual([1, 2, 3]);
  });

  it('the defaults (15 s, 3) find a dead tunnel within 60 s', () => {
    expect(deadTunnelBoundMs(15_000, 3)).toBe(48_750);
    expect(deadTunnelBoundMs(15_000, 3)).toBeLessThanOrEqual(60_000);
  });

  it('every heartbeat heard restarts the window', () => {
    const { hb, silent } = beating(1000, 3000);
    for (let i = 0; i < 10; i++) {
      vi.advanceTimersByTime(2500);
      hb.heard();
    }
    expect(silent).toEqual([]);
    vi.advanceTimersByTime(4000);
    expect(silent).toHaveLength(1);
  });

  it('a welcome that changes the interval: the sequence goes on, the window is the new one', () => {
    const { hb, sent, silent } = beating(1000, 1000 * 3);
    vi.advanceTimersByTime(2000);
    expect(sent).toEqual([1, 2]);
    hb.heard();
    hb.start(500, 500 * 2);
    vi.advanceTimersByTime(1000);
    expect(sent).toEqual([1, 2, 3, 4]);
    expect(silent).toEqual([]);
    vi.advanceTimersByTime(125);
    expect(silent).toEqual([1125]);
  });

  it('stop ends the beats', () => {
    const { hb, sent, silent } = beating(1000, 3000);
    vi.advanceTimersByTime(1000);
    hb.stop();
    vi.advanceTimersByTime(10_000);
    expect(sent).toEqual([1]);
    expect(silent).toEqual([]);
  });
});
