import { spawn } from 'node:child_process';
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors.js';
import { DEFAULT_MAX_HELLO_BYTES, parseClientHello, type ClientHelloResult } from '../../src/mux/clienthello.js';

// ---- a small ClientHello encoder ------------------------------------------------------------------------------

const u8 = (n: number) => Buffer.from([n]);
const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff]);
const u24 = (n: number) => Buffer.from([(n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff]);
const vec8 = (b: Buffer) => Buffer.concat([u8(b.length), b]);
const vec16 = (b: Buffer) => Buffer.concat([u16(b.length), b]);
const latin1 = (s: string) => Buffer.from(s, 'latin1');

interface Ext {
  type: number;
  data: Buffer;
}

const ext = (type: number, data: Buffer): Ext => ({ type, data });
const sniExt = (...entries: Array<string | Buffer | [number, Buffer]>): Ext =>
  ext(
    0,
    vec16(
      Buffer.concat(
        entries.map((e) =>
          Array.isArray(e) ? Buffer.concat([u8(e[0]), vec16(e[1])]) : Buffer.concat([u8(0), vec16(typeof e === 'string' ? latin1(e) : e)]),
        ),
      ),
    ),
  );
const alpnExt = (...names: Array<string | Buffer>): Ext =>
  ext(16, vec16(Buffer.concat(names.map((n) => vec8(typeof n === 'string' ? latin1(n) : n)))));
const versionsExt = (...versions: number[]): Ext => ext(43, vec8(Buffer.concat(versions.map(u16))));

interface HelloSpec {
  legacyVersion?: number;
  sessionId?: Buffer;
  suites?: Buffer;
  compression?: Buffer;
  /** null: no extensions block at all. */
  extensions?: Ext[] | null;
  /** Raw bytes appended to the body (after the extensions block). */
  trailer?: Buffer;
}

function helloBody(spec: HelloSpec = {}): Buffer {
  const parts: Buffer[] = [
    u16(spec.legacyVersion ?? 0x0303),
    Buffer.alloc(32, 0x42),
    vec8(spec.sessionId ?? Buffer.alloc(32, 0x11)),
    vec16(spec.suites ?? Buffer.from([0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f])),
    vec8(spec.compression ?? Buffer.from([0])),
  ];
  const exts = spec.extensions === undefined ? [sniExt('example.com'), alpnExt('h2', 'http/1.1')] : spec.extensions;
  if (exts !== null) parts.push(vec16(Buffer.concat(exts.map((e) => Buffer.concat([u16(e.type), vec16(e.data)])))));
  if (spec.trailer) parts.push(spec.trailer);
  return Buffer.concat(parts);
}

const handshake = (body: Buffer, type = 1) => Buffer.concat([u8(type), u24(body.length), body]);

/** Wraps a handshake stream in records of at most `size` bytes. */
function records(stream: Buffer, size = 16384, version = 0x0301): Buffer {
  const out: Buffer[] = [];
  for (let off = 0; off < stream.length; off += size) {
    const frag = stream.subarray(off, off + size);
    out.push(Buffer.concat([u8(22), u16(version), u16(frag.length), frag]));
  }
  return Buffer.concat(out);
}

const hello = (spec: HelloSpec = {}, size?: number) => records(handshake(helloBody(spec)), size);

/** Independent framing: the handshake stream carried by the records at the start of buf, and their length. */
function unrecord(buf: Buffer): { stream: Buffer; used: number; version: number } | undefined {
  const frags: Buffer[] = [];
  let off = 0;
  let have = 0;
  while (buf.length - off >= 5) {
    const len = buf.readUInt16BE(off + 3);
    if (buf.length - off - 5 < len) return undefined;
    frags.push(buf.subarray(off + 5, off + 5 + len));
    have += len;
    off += 5 + len;
    const stream = Buffer.concat(frags);
    if (have >= 4 && have >= 4 + stream.readUIntBE(1, 3)) return { stream, used: off, version: buf.readUInt16BE(1) };
  }
  return undefined;
}

/** Re-wraps a captured hello into records of `size` bytes, fixing the record headers. */
function rerecord(captured: Buffer, size: number): Buffer {
  const u = unrecord(captured)!;
  return records(u.stream, size, u.version);
}

// ---- helpers ---------------------------------------------------------------------------------------------------

function errorOf(f: () => unknown): GatewayError {
  try {
    f();
  } catch (err) {
    if (err instanceof GatewayError) return err;
    throw err;
  }
  throw new Error('expected a GatewayError, got a result');
}

const codeOf = (buf: Buffer, limits?: { maxBytes?: number }) => errorOf(() => parseClientHello(buf, limits)).code;

/** Feeds buf one byte at a time: need-more for every strict prefix, then the answer for the whole. */
function byteByByte(buf: Buffer): ClientHelloResult {
  for (let n = 0; n < buf.length; n++) {
    expect(parseClientHello(buf.subarray(0, n)), `prefix of ${n} bytes`).toEqual({ kind: 'need-more' });
  }
  return parseClientHello(buf);
}

// ---- real ClientHellos, captured on a plain TCP listener --------------------------------------------------------

async function capture(startClient: (port: number) => () => void): Promise<Buffer> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  let stop: (() => void) | undefined;
  try {
    return await new Promise<Buffer>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no ClientHello within 15 s')), 15_000);
      server.once('connection', (sock) => {
        let acc = Buffer.alloc(0);
        sock.on('error', () => {});
        sock.on('data', (chunk: Buffer) => {
          acc = Buffer.concat([acc, chunk]);
          const u = unrecord(acc);
          if (u === undefined) return;
          clearTimeout(timer);
          resolve(Buffer.from(acc.subarray(0, u.used)));
          sock.destroy();
        });
      });
      stop = startClient(port);
    });
  } finally {
    stop?.();
    server.close();
  }
}

function nodeClient(options: { servername?: string; ALPNProtocols?: string[]; maxVersion?: tls.SecureVersion }) {
  return (port: number) => {
    const socket = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false, ...options });
    socket.on('error', () => {});
    return () => socket.destroy();
  };
}

function opensslClient(args: string[]) {
  return (port: number) => {
    const child = spawn('openssl', ['s_client', '-connect', `127.0.0.1:${port}`, ...args], {
      stdio: ['pipe', 'ignore', 'ignore'],
    });
    child.on('error', () => {});
    return () => {
      child.kill();
    };
  };
}

interface Captured {
  name: string;
  bytes: Buffer;
  serverName: string | undefined;
  alpn: string[];
  tls13: boolean;
}

const captured: Captured[] = [];

beforeAll(async () => {
  const cases: Array<Omit<Captured, 'bytes'> & { start: (port: number) => () => void }> = [
    { name: 'openssl s_client -servername x -alpn a,b', start: opensslClient(['-servername', 'x', '-alpn', 'a,b']), serverName: 'x', alpn: ['a', 'b'], tls13: true },
    {
      name: 'openssl s_client -tls1_2 (no supported_versions)',
      start: opensslClient(['-tls1_2', '-servername', 'db.Example.com', '-alpn', 'gateway-postgres-ping']),
      serverName: 'db.example.com',
      alpn: ['gateway-postgres-ping'],
      tls13: false,
    },
    {
      name: 'node tls.connect, mixed-case servername, two ALPN protocols',
      start: nodeClient({ servername: 'Proxy.Gateway.Example.COM', ALPNProtocols: ['gateway-reversetunnel', 'http/1.1'] }),
      serverName: 'proxy.gateway.example.com',
      alpn: ['gateway-reversetunnel', 'http/1.1'],
      tls13: true,
    },
    {
      name: 'node tls.connect, kube SNI, h2',
      start: nodeClient({ servername: 'kube-gateway-proxy-alpn.gateway.cluster.local', ALPNProtocols: ['h2'] }),
      serverName: 'kube-gateway-proxy-alpn.gateway.cluster.local',
      alpn: ['h2'],
      tls13: true,
    },
    { name: 'node tls.connect to an IP, no SNI, no ALPN', start: nodeClient({}), serverName: undefined, alpn: [], tls13: true },
    {
      name: 'node tls.connect, TLS 1.2 at most',
      start: nodeClient({ servername: 'web.example.org', ALPNProtocols: ['http/1.1'], maxVersion: 'TLSv1.2' }),
      serverName: 'web.example.org',
      alpn: ['http/1.1'],
      tls13: false,
    },
  ];
  for (const c of cases) {
    captured.push({ name: c.name, serverName: c.serverName, alpn: c.alpn, tls13: c.tls13, bytes: await capture(c.start) });
  }
}, 60_000);

describe('real ClientHellos (openssl s_client, node tls.connect)', () => {
  const names = [
    'openssl s_client -servername x -alpn a,b',
    'openssl s_client -tls1_2 (no supported_versions)',
    'node tls.connect, mixed-case servername, two ALPN protocols',
    'node tls.connect, kube SNI, h2',
    'node tls.connect to an IP, no SNI, no ALPN',
    'node tls.connect, TLS 1.2 at most',
  ];
  const get = (name: string) => captured.find((c) => c.name === name)!;

  it.each(names)('%s: SNI, ALPN, versions, length', (name) => {
    const c = get(name);
    const r = parseClientHello(c.bytes);
    if (r.kind !== 'hello') throw new Error('expected a hello');
    expect(r.serverName).toBe(c.serverName);
    expect(r.alpn).toEqual(c.alpn);
    expect(r.length).toBe(c.bytes.length);
    expect(r.legacyVersion).toBe(0x0303);
    if (c.tls13) expect(r.supportedVersions).toContain(0x0304);
    else expect(r.supportedVersions).not.toContain(0x0304);
  });

  it.each(names)('%s: bytes after the hello are not looked at', (name) => {
    const c = get(name);
    const more = Buffer.concat([c.bytes, Buffer.from([0x14, 0x03, 0x03, 0x00, 0x01, 0x01, 0x17, 0x03])]);
    expect(parseClientHello(more)).toEqual(parseClientHello(c.bytes));
  });

  it.each(names)('%s: delivered one byte at a time', (name) => {
    const c = get(name);
    expect(byteByByte(c.bytes)).toEqual(parseClientHello(c.bytes));
  });

  it.each(names)('%s: fragmented into records of 100 bytes, one byte at a time', (name) => {
    const c = get(name);
    const frag = rerecord(c.bytes, 100);
    expect(frag.length).toBeGreaterThan(c.bytes.length); // more record headers
    const whole = parseClientHello(c.bytes);
    if (whole.kind !== 'hello') throw new Error('expected a hello');
    expect(byteByByte(frag)).toEqual({ ...whole, length: frag.length });
  });

  it.each(names)('%s: fragmented into 1-byte and 7-byte records', (name) => {
    const c = get(name);
    const whole = parseClientHello(c.bytes);
    for (const size of [1, 7]) {
      const frag = rerecord(c.bytes, size);
      expect(parseClientHello(frag)).toEqual({ ...whole, length: frag.length });
    }
  });

  it('property: every prefix of a real hello, fragmented or not, is need-more', () => {
    const inputs = captured.flatMap((c) => [c.bytes, rerecord(c.bytes, 100), rerecord(c.bytes, 33)]);
    fc.assert(
      fc.property(fc.constantFrom(...inputs), fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }), (buf, at) => {
        const cut = Math.floor(at * buf.length);
        expect(parseClientHello(buf.subarray(0, cut))).toEqual({ kind: 'need-more' });
      }),
      { numRuns: 500 },
    );
  });

  it('property: real hellos with random bytes changed or cut never throw anything but a GatewayError', () => {
    const inputs = captured.map((c) => c.bytes);
    fc.assert(
      fc.property(
        fc.constantFrom(...inputs),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 6 }),
        fc.nat(),
        (original, edits, cut) => {
          const buf = Buffer.from(original);
          for (const [at, v] of edits) buf[at % buf.length] = v;
          expectBounded(buf.subarray(0, cut % (buf.length + 1)));
        },
      ),
      { numRuns: 1000 },
    );
  });
});

/** Parses, accepting only a result or one of the two mux errors, and never throws anything else (timing is measured in bench/, not asserted here). */
function expectBounded(buf: Buffer, limits?: { maxBytes?: number }): void {
  try {
    const r = parseClientHello(buf, limits);
    expect(['need-more', 'hello']).toContain(r.kind);
    if (r.kind === 'hello') expect(r.length).toBeLessThanOrEqual(buf.length);
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    expect(['GW_ERR_MUX_BAD_HELLO', 'GW_ERR_MUX_HELLO_TOO_LARGE']).toContain((err as GatewayError).code);
  }
}

// ---- generated hellos -------------------------------------------------------------------------------------------

describe('generated ClientHellos', () => {
  it('a minimal hello without extensions', () => {
    const buf = hello({ extensions: null });
    expect(parseClientHello(buf)).toEqual({ kind: 'hello', alpn: [], length: buf.length, legacyVersion: 0x0303, supportedVersions: [] });
  });

  it('an empty extensions block', () => {
    const buf = hello({ extensions: [] });
    expect(parseClientHello(buf)).toMatchObject({ kind: 'hello', alpn: [], supportedVersions: [] });
  });

  it('keeps ALPN order and skips GREASE identifiers', () => {
    const r = parseClientHello(hello({ extensions: [alpnExt(Buffer.from([0x3a, 0x3a]), 'gateway-tcp-ping', 'h2')] }));
    expect(r).toMatchObject({ alpn: ['gateway-tcp-ping', 'h2'] });
  });

  it('leaves GREASE values out of supported_versions', () => {
    const r = parseClientHello(hello({ extensions: [versionsExt(0x7a7a, 0x0304, 0x0303)] }));
    expect(r).toMatchObject({ supportedVersions: [0x0304, 0x0303] });
  });

  it('skips unknown extensions and server_name entries of another type', () => {
    const r = parseClientHello(
      hello({ extensions: [ext(0xfe0d, Buffer.alloc(200, 7)), sniExt([5, latin1('whatever')], 'a.example'), ext(21, Buffer.alloc(0))] }),
    );
    expect(r).toMatchObject({ serverName: 'a.example' });
  });

  it.each([
    ['an IPv4 literal', '192.0.2.1'],
    ['an IPv6 literal', '2001:db8::1'],
    ['an IPv4-mapped IPv6 literal', '::ffff:192.0.2.1'],
    ['an all-numeric name', '10.0.0.010'],
  ])('ignores %s in server_name (RFC 6066 forbids it): serverName undefined', (_n, name) => {
    const r = parseClientHello(hello({ extensions: [sniExt(name), alpnExt('h2')] }));
    expect(r).toMatchObject({ kind: 'hello', alpn: ['h2'] });
    expect((r as { serverName?: string }).serverName).toBeUndefined();
  });

  it.each([
    ['underscores', 'svc_x._tcp.example', 'svc_x._tcp.example'],
    ['upper case', 'DB.EXAMPLE.COM', 'db.example.com'],
    ['a 63-byte label', `${'a'.repeat(63)}.example`, `${'a'.repeat(63)}.example`],
    ['255 bytes', `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(63)}`, undefined],
  ])('accepts a server name with %s', (_n, name, expected) => {
    const r = parseClientHello(hello({ extensions: [sniExt(name)] }));
    expect(r).toMatchObject({ serverName: expected ?? name });
  });

  it('property: a generated hello round-trips, in any fragmentation, and every prefix is need-more', () => {
    const label = fc.stringMatching(/^[a-zA-Z][a-zA-Z0-9_-]{0,19}$/);
    const serverName = fc.array(label, { minLength: 1, maxLength: 6 }).map((ls) => ls.join('.'));
    // Not a GREASE value (RFC 8701: two equal bytes 0x?A, e.g. "JJ"), which the parser rightly skips.
    const isGrease = (n: string) => n.length === 2 && n.charCodeAt(0) === n.charCodeAt(1) && (n.charCodeAt(0) & 0x0f) === 0x0a;
    const alpnName = fc.stringMatching(/^[\x21-\x7e]{1,40}$/).filter((n) => !isGrease(n));
    const spec = fc.record({
      serverName: fc.option(serverName, { nil: undefined }),
      alpn: fc.array(alpnName, { maxLength: 6 }),
      versions: fc.array(fc.constantFrom(0x0301, 0x0302, 0x0303, 0x0304), { maxLength: 4 }),
      others: fc.uniqueArray(fc.record({ type: fc.integer({ min: 44, max: 0xffff }), data: fc.uint8Array({ maxLength: 60 }) }), {
        selector: (e) => e.type,
        maxLength: 5,
      }),
      sessionId: fc.uint8Array({ maxLength: 32 }),
      recordSize: fc.integer({ min: 1, max: 16384 }),
      recordVersion: fc.constantFrom(0x0300, 0x0301, 0x0302, 0x0303, 0x0304),
      seed: fc.nat(),
    });
    fc.assert(
      fc.property(spec, fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }), (s, at) => {
        const exts: Ext[] = s.others.map((o) => ext(o.type, Buffer.from(o.data)));
        if (s.serverName !== undefined) exts.push(sniExt(s.serverName));
        if (s.alpn.length > 0) exts.push(alpnExt(...s.alpn));
        if (s.versions.length > 0) exts.push(versionsExt(...s.versions));
        // deterministic shuffle from the seed
        exts.sort((a, b) => ((a.type * 2654435761 + s.seed) % 997) - ((b.type * 2654435761 + s.seed) % 997));
        const body = helloBody({ extensions: exts, sessionId: Buffer.from(s.sessionId) });
        const buf = records(handshake(body), s.recordSize, s.recordVersion);
        const r = parseClientHello(buf);
        expect(r).toEqual({
          kind: 'hello',
          ...(s.serverName !== undefined ? { serverName: s.serverName.toLowerCase() } : {}),
          alpn: s.alpn,
          length: buf.length,
          legacyVersion: 0x0303,
          supportedVersions: s.versions,
        });
        expect(parseClientHello(Buffer.concat([buf, Buffer.from('trailing')]))).toEqual(r);
        expect(parseClientHello(buf.subarray(0, Math.floor(at * buf.length)))).toEqual({ kind: 'need-more' });
      }),
      { numRuns: 300 },
    );
  });

  it('honours maxBytes exactly', () => {
    const buf = hello();
    expect(parseClientHello(buf, { maxBytes: buf.length })).toMatchObject({ kind: 'hello' });
    expect(codeOf(buf, { maxBytes: buf.length - 1 })).toBe('GW_ERR_MUX_HELLO_TOO_LARGE');
    expect(DEFAULT_MAX_HELLO_BYTES).toBe(16404);
  });

  it('accepts a hello of the largest default size (16 KiB of padding, two records)', () => {
    const base = helloBody({ extensions: [sniExt('a.example')] }).length + 4 + 4; // + handshake header + padding ext header
    const padLen = DEFAULT_MAX_HELLO_BYTES - 10 - base; // two record headers
    const buf = hello({ extensions: [sniExt('a.example'), ext(21, Buffer.alloc(padLen))] });
    expect(buf.length).toBe(DEFAULT_MAX_HELLO_BYTES);
    expect(parseClientHello(buf)).toMatchObject({ kind: 'hello', serverName: 'a.example', length: buf.length });
    const bigger = hello({ extensions: [sniExt('a.example'), ext(21, Buffer.alloc(padLen + 1))] });
    expect(codeOf(bigger)).toBe('GW_ERR_MUX_HELLO_TOO_LARGE');
  });
});

// ---- hostile input ----------------------------------------------------------------------------------------------

describe('hostile ClientHellos', () => {
  it('refuses a 64 KiB server name as too large, as soon as the handshake header is in', () => {
    const buf = hello({ extensions: [sniExt('a'.repeat(65536))] });
    expect(codeOf(buf)).toBe('GW_ERR_MUX_HELLO_TOO_LARGE');
    expect(codeOf(buf.subarray(0, 9))).toBe('GW_ERR_MUX_HELLO_TOO_LARGE'); // record header + handshake header
    // With the limit raised, the name itself is refused.
    expect(codeOf(buf, { maxBytes: 1 << 20 })).toBe('GW_ERR_MUX_BAD_HELLO');
  });

  it('refuses a handshake that announces 16 MiB at once', () => {
    expect(codeOf(Buffer.from([0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff]))).toBe('GW_ERR_MUX_HELLO_TOO_LARGE');
  });

  const badHellos: Array<[string, Buffer]> = [
    ['an alert record', Buffer.from([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28])],
    ['an SSLv2-compatible hello', Buffer.from([0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00])],
    ['an application data record', Buffer.from([0x17, 0x03, 0x03, 0x00, 0x01, 0x00])],
    ['record version 0x0305', Buffer.from([0x16, 0x03, 0x05])],
    ['record version 0x0201', Buffer.from([0x16, 0x02, 0x01])],
    ['an empty handshake record', Buffer.from([0x16, 0x03, 0x01, 0x00, 0x00])],
    ['a record longer than 2^14', Buffer.from([0x16, 0x03, 0x01, 0x40, 0x01])],
    ['a ServerHello', records(handshake(helloBody(), 2))],
    ['a second handshake message in the same record', records(Buffer.concat([handshake(helloBody()), handshake(Buffer.alloc(0), 20)]))],
    [
      'a record that goes on after the hello (declared)',
      (() => {
        const h = hello();
        const r = Buffer.concat([h, Buffer.alloc(10)]);
        r.writeUInt16BE(h.length - 5 + 10, 3);
        return r.subarray(0, h.length); // the extra bytes have not even arrived: still refused
      })(),
    ],
    [
      'a change_cipher_spec record between two fragments',
      (() => {
        const hs = handshake(helloBody());
        return Buffer.concat([records(hs.subarray(0, 50)), Buffer.from([0x14, 0x03, 0x03, 0x00, 0x01, 0x01]), records(hs.subarray(50))]);
      })(),
    ],
    ['legacy_version 0x0200', hello({ legacyVersion: 0x0200 })],
    ['a 33-byte session_id', hello({ sessionId: Buffer.alloc(33) })],
    ['an odd cipher_suites length', hello({ suites: Buffer.from([0x13, 0x01, 0x13]) })],
    ['no cipher suite', hello({ suites: Buffer.alloc(0) })],
    ['no compression method', hello({ compression: Buffer.alloc(0) })],
    ['bytes after the extensions block', hello({ trailer: Buffer.from([0]) })],
    ['a duplicate extension', hello({ extensions: [alpnExt('h2'), alpnExt('h2')] })],
    ['a zero-length ALPN name', hello({ extensions: [alpnExt('h2', '')] })],
    ['an empty ALPN list', hello({ extensions: [ext(16, vec16(Buffer.alloc(0)))] })],
    ['an empty ALPN extension', hello({ extensions: [ext(16, Buffer.alloc(0))] })],
    ['a non-printable ALPN name', hello({ extensions: [alpnExt(latin1('h2\n'))] })],
    ['an ALPN name with a space', hello({ extensions: [alpnExt('http 1.1')] })],
    ['an ALPN name that runs past its list', hello({ extensions: [ext(16, Buffer.concat([u16(3), u8(5), latin1('h2')]))] })],
    ['an ALPN list shorter than the extension', hello({ extensions: [ext(16, Buffer.concat([u16(3), u8(2), latin1('h2'), u8(0)]))] })],
    ['an empty server_name list', hello({ extensions: [ext(0, vec16(Buffer.alloc(0)))] })],
    ['an empty host_name', hello({ extensions: [sniExt('')] })],
    ['two host_names', hello({ extensions: [sniExt('a.example', 'b.example')] })],
    ['a host_name with a space', hello({ extensions: [sniExt('a b.example')] })],
    ['a host_name with a NUL', hello({ extensions: [sniExt('a.example\0.evil')] })],
    ['a host_name with a slash', hello({ extensions: [sniExt('a.example/x')] })],
    ['a UTF-8 host_name', hello({ extensions: [sniExt(Buffer.from('bücher.example', 'utf8'))] })],
    ['a bracketed IPv6 host_name', hello({ extensions: [sniExt('[2001:db8::1]')] })],
    ['a host_name with a trailing dot', hello({ extensions: [sniExt('a.example.')] })],
    ['a host_name with an empty label', hello({ extensions: [sniExt('a..example')] })],
    ['a host_name with a 64-byte label', hello({ extensions: [sniExt(`${'a'.repeat(64)}.example`)] })],
    ['a 256-byte host_name', hello({ extensions: [sniExt(`${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(64)}`)] })],
    ['a host_name that runs past the list', hello({ extensions: [ext(0, Buffer.concat([u16(8), u8(0), u16(20), latin1('abcde')]))] })],
    ['an odd supported_versions list', hello({ extensions: [ext(43, vec8(Buffer.from([3, 4, 3])))] })],
    ['an empty supported_versions list', hello({ extensions: [versionsExt()] })],
    [
      'an extension whose length points past the end',
      (() => {
        const body = helloBody({ extensions: [ext(0xabcd, Buffer.alloc(4))] });
        body.writeUInt16BE(0x1000, body.length - 6); // the extension's length field
        return records(handshake(body));
      })(),
    ],
    [
      'an extensions block whose length points past the end',
      (() => {
        const body = helloBody({ extensions: [alpnExt('h2')] });
        const at = body.length - (4 + 2 + 3) - 2; // the block's length field
        body.writeUInt16BE(body.readUInt16BE(at) + 5, at);
        return records(handshake(body));
      })(),
    ],
    [
      'a truncated extension header',
      records(handshake(Buffer.concat([helloBody({ extensions: null }), u16(3), Buffer.from([0x00, 0x10, 0x00])]))),
    ],
    [
      'a session_id length past the end of the message',
      records(handshake(Buffer.concat([u16(0x0303), Buffer.alloc(32), u8(32), Buffer.alloc(5)]))),
    ],
    ['a handshake message shorter than a random', records(handshake(Buffer.from([0x03, 0x03, 0x00])))],
  ];

  it.each(badHellos)('refuses %s as a bad hello', (_name, buf) => {
    const err = errorOf(() => parseClientHello(buf));
    expect(err.code).toBe('GW_ERR_MUX_BAD_HELLO');
    expect(err.message).toMatch(/^bad TLS ClientHello: /);
  });

  it.each(badHellos)('%s, fed byte by byte: need-more, then the same error (never a result)', (_name, buf) => {
    let n = 0;
    for (; n <= buf.length; n++) {
      let r: ClientHelloResult;
      try {
        r = parseClientHello(buf.subarray(0, n));
      } catch (err) {
        expect((err as GatewayError).code).toBe('GW_ERR_MUX_BAD_HELLO');
        break;
      }
      expect(r).toEqual({ kind: 'need-more' });
    }
    expect(n).toBeLessThanOrEqual(buf.length);
  });

  it('a valid hello cut anywhere is need-more, never an error', () => {
    const buf = hello({ extensions: [sniExt('a.example'), alpnExt('h2', 'http/1.1'), versionsExt(0x0304, 0x0303)] }, 50);
    for (let n = 0; n < buf.length; n++) expect(parseClientHello(buf.subarray(0, n))).toEqual({ kind: 'need-more' });
    expect(parseClientHello(buf.subarray(0, Math.floor(buf.length / 2)))).toEqual({ kind: 'need-more' });
  });

  it('property: arbitrary bytes never throw anything but a mux GatewayError', () => {
    const header = fc
      .tuple(fc.integer({ min: 0, max: 4 }), fc.integer({ min: 0, max: 0x4000 }), fc.integer({ min: 0, max: 0xffffff }))
      .map(([minor, recLen, hsLen]) => Buffer.concat([Buffer.from([0x16, 0x03, minor]), u16(recLen), u8(1), u24(hsLen)]));
    const input = fc.oneof(
      fc.uint8Array({ maxLength: 3000 }).map((a) => Buffer.from(a)),
      fc.tuple(header, fc.uint8Array({ maxLength: 3000 })).map(([h, rest]) => Buffer.concat([h, Buffer.from(rest)])),
      fc.tuple(header, fc.uint8Array({ maxLength: 300 })).map(([h, rest]) => {
        // a plausible body: version, random, then random bytes, with the lengths fixed up
        const body = Buffer.concat([u16(0x0303), Buffer.alloc(32), Buffer.from(rest)]);
        return records(handshake(body), 1 + (h[4]! % 200));
      }),
    );
    fc.assert(
      fc.property(input, fc.option(fc.integer({ min: 9, max: 1 << 20 }), { nil: undefined }), (buf, maxBytes) => {
        expectBounded(buf, maxBytes === undefined ? undefined : { maxBytes });
      }),
      { numRuns: 2000 },
    );
  });

  it('a hello of 1-byte records: too large by default (headers count), parsed with a larger limit', () => {
    const big = hello({ extensions: [ext(21, Buffer.alloc(3000))] }, 1);
    expect(big.length).toBeGreaterThan(DEFAULT_MAX_HELLO_BYTES);
    expect(codeOf(big)).toBe('GW_ERR_MUX_HELLO_TOO_LARGE'); // each byte costs a 5-byte record header
    const r = parseClientHello(big, { maxBytes: big.length });
    expect(r).toMatchObject({ kind: 'hello', length: big.length });
  });
});

afterAll(() => {
  captured.length = 0;
});
