/**
 * The end-to-end streams' contract (src/tunnel/e2e.ts): the grant's token, its server name, the data connections'
 * preamble and key, the hello's capability. Each check is shown refusing what it must refuse.
 */
import { generateKeyPairSync, X509Certificate } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  badE2EOpen,
  checkDataPreamble,
  dataAnswer,
  dataKeyId,
  dataPairOf,
  dataPreamble,
  DATA_ANSWER_MAX_BYTES,
  DATA_POOL_MAX,
  DATA_PREAMBLE_MAX_BYTES,
  DATA_TUNNELS_MAX,
  decodeGrant,
  e2eCapabilityOf,
  e2eLine,
  E2E_LINE_MAX_BYTES,
  GRANT_TOKEN_MAX_BYTES,
  parseE2ELine,
  e2eServerName,
  grantIdOfServerName,
  parseDataAnswer,
  parseDataPreamble,
  signGrant,
  spkiHash,
  verifyGrant,
  type E2EGrant,
} from '../../src/tunnel/e2e.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const ec = () => generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
const NOW = 1_800_000_000_000;

function grant(over: Partial<E2EGrant> = {}): E2EGrant {
  return {
    v: 1,
    id: '0123456789abcdef0123456789abcdef',
    iss: '11111111-2222-3333-4444-555555555555',
    sub: 'alice',
    key: 'A'.repeat(43),
    roles: ['access'],
    service: 'app',
    resource: 'iperf',
    agent: '66666666-7777-8888-9999-000000000000',
    iat: NOW - 1000,
    exp: NOW + 29_000,
    ...over,
  };
}

describe('the grant token', () => {
  const proxy = ec();
  const other = ec();

  it('verifies with the issuing key and gives back every field', () => {
    const token = signGrant(grant({ db_access: { users: { allow: ['app'], deny: [] }, names: { allow: ['*'], deny: [] } } }), proxy.privateKey);
    const r = verifyGrant(token, proxy.publicKey, NOW);
    expect(r).toEqual({ ok: true, grant: expect.objectContaining({ sub: 'alice', resource: 'iperf', db_access: { users: { allow: ['app'], deny: [] }, names: { allow: ['*'], deny: [] } } }) });
  });

  it("refuses another key's signature, an altered body, an expired grant and one issued too far ahead", () => {
    const token = signGrant(grant(), proxy.privateKey);
    expect(verifyGrant(token, other.publicKey, NOW)).toEqual({ ok: false, why: "the grant's signature is not the issuing Proxy's" });
    const [body, sig] = token.split('.');
    const altered = Buffer.from(JSON.stringify({ ...grant(), sub: 'mallory' })).toString('base64url');
    expect(verifyGrant(`${altered}.${sig}`, proxy.publicKey, NOW)).toMatchObject({ ok: false, why: expect.stringContaining('signature') });
    expect(verifyGrant(`${body}.${'A'.repeat(10)}`, proxy.publicKey, NOW)).toMatchObject({ ok: false });
    expect(verifyGrant(token, proxy.publicKey, NOW + 29_000)).toEqual({ ok: false, why: 'the grant has expired' });
    const ahead = signGrant(grant({ iat: NOW + 120_000, exp: NOW + 150_000 }), proxy.privateKey);
    expect(verifyGrant(ahead, proxy.publicKey, NOW)).toMatchObject({ ok: false, why: expect.stringContaining('future') });
  });

  it('refuses tokens that are not grants: shape, size, fields', () => {
    const enc = (v: unknown) => `${Buffer.from(JSON.stringify(v)).toString('base64url')}.sig`;
    expect(decodeGrant('x'.repeat(9000))).toMatchObject({ ok: false, why: expect.stringContaining('8 KiB') });
    expect(decodeGrant('nodot')).toMatchObject({ ok: false });
    expect(decodeGrant('a.b.c')).toMatchObject({ ok: false });
    expect(decodeGrant(`${Buffer.from('not json').toString('base64url')}.x`)).toEqual({ ok: false, why: 'the grant is not JSON' });
    expect(decodeGrant(enc([1]))).toMatchObject({ ok: false, why: 'the grant is not an object' });
    expect(decodeGrant(enc({ ...grant(), v: 2 }))).toMatchObject({ ok: false, why: expect.stringContaining('version') });
    expect(decodeGrant(enc({ ...grant(), id: 'ABC' }))).toMatchObject({ ok: false, why: expect.stringContaining('id') });
    expect(decodeGrant(enc({ ...grant(), sub: 'al\nice' }))).toMatchObject({ ok: false, why: expect.stringContaining('sub') });
    expect(decodeGrant(enc({ ...grant(), service: 'ftp' }))).toMatchObject({ ok: false, why: expect.stringContaining('service') });
    expect(decodeGrant(enc({ ...grant(), roles: 'access' }))).toMatchObject({ ok: false, why: expect.stringContaining('roles') });
    expect(decodeGrant(enc({ ...grant(), exp: NOW - 5000 }))).toMatchObject({ ok: false, why: expect.stringContaining('interval') });
    expect(decodeGrant(enc(grant()))).toMatchObject({ ok: true });
  });
});

describe('the server name', () => {
  it('carries the grant id and nothing else is taken for one', () => {
    const id = '0123456789abcdef0123456789abcdef';
    expect(grantIdOfServerName(e2eServerName(id))).toBe(id);
    for (const name of [undefined, '', 'proxy.example.com', `${id}.e2e.gateway.invalid.evil.com`, `x${id}.e2e.gateway.invalid`, `${id.toUpperCase()}.e2e.gateway.invalid`, `${id.slice(1)}.e2e.gateway.invalid`]) {
      expect(grantIdOfServerName(name)).toBeUndefined();
    }
  });
});

describe("a certificate's key hash", () => {
  let pki: TestPki;
  beforeAll(async () => (pki = await makeTestPki()));
  afterAll(async () => pki.cleanup());

  it('is the same for the PEM and the parsed certificate, and differs between two keys', async () => {
    const a = await pki.clientCert({ cn: 'alice' });
    const b = await pki.clientCert({ cn: 'alice' });
    expect(spkiHash(a.certPem)).toBe(spkiHash(new X509Certificate(a.certPem)));
    expect(spkiHash(a.certPem)).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(spkiHash(a.certPem)).not.toBe(spkiHash(b.certPem));
  });
});

describe('the data preamble', () => {
  const key = Buffer.alloc(32, 7);
  const otherKey = Buffer.alloc(32, 8);
  const keys = Array.from({ length: DATA_TUNNELS_MAX }, (_, i) => Buffer.alloc(32, 20 + i));

  it('parses incrementally and checks against the key it was made with', () => {
    const line = dataPreamble([key], 42);
    const whole = Buffer.concat([line, Buffer.from([0x16, 0x03, 0x01])]);
    for (let i = 0; i < line.length; i++) expect(parseDataPreamble(whole.subarray(0, i))).toEqual({ kind: 'need-more' });
    const p = parseDataPreamble(whole);
    expect(p).toMatchObject({ kind: 'ok', pairs: [{ kid: dataKeyId(key) }], n: 42, length: line.length });
    if (p.kind !== 'ok') throw new Error('unreachable');
    expect(checkDataPreamble(key, p)).toBe(true);
    expect(checkDataPreamble(otherKey, p)).toBe(false);
    expect(checkDataPreamble(key, { ...p, n: 43 })).toBe(false);
  });

  it('carries one pair per tunnel: each key finds its own, in any position, and none is good for another key or number', () => {
    const p = parseDataPreamble(dataPreamble([otherKey, key, keys[0]!], 7));
    if (p.kind !== 'ok') throw new Error(`not parsed: ${JSON.stringify(p)}`);
    expect(p.pairs.map((x) => x.kid)).toEqual([dataKeyId(otherKey), dataKeyId(key), dataKeyId(keys[0]!)]);
    for (const k of [otherKey, key, keys[0]!]) expect(checkDataPreamble(k, p)).toBe(true);
    expect(checkDataPreamble(keys[1]!, p)).toBe(false);
    expect(dataPairOf(keys[1]!, p)).toBeUndefined();
    // The kid of one key with the MAC another key made: refused (a Proxy cannot pass one tunnel's pair off as another's).
    const swapped = { ...p, pairs: [{ kid: dataKeyId(key), mac: p.pairs[0]!.mac }] };
    expect(checkDataPreamble(key, swapped)).toBe(false);
    expect(checkDataPreamble(key, { ...p, n: 8 })).toBe(false);
  });

  it('fits DATA_TUNNELS_MAX pairs with the largest number in its cap; more pairs are refused, by the maker and the parser', () => {
    const line = dataPreamble(keys, 2 ** 53 - 1);
    expect(line.length).toBe(DATA_PREAMBLE_MAX_BYTES);
    const p = parseDataPreamble(line);
    expect(p).toMatchObject({ kind: 'ok', n: 2 ** 53 - 1 });
    if (p.kind !== 'ok') throw new Error('unreachable');
    expect(p.pairs).toHaveLength(DATA_TUNNELS_MAX);
    expect(checkDataPreamble(keys[DATA_TUNNELS_MAX - 1]!, p)).toBe(true);
    expect(() => dataPreamble([...keys, key], 1)).toThrow(RangeError);
    expect(() => dataPreamble([], 1)).toThrow(RangeError);
    const pair = dataPreamble([key], 1).toString('latin1').trim().split(' ')[2]!;
    const over = Buffer.from(`GWDATA1 1 ${Array.from({ length: DATA_TUNNELS_MAX + 1 }, () => pair).join(' ')}\n`, 'latin1');
    // DATA_TUNNELS_MAX + 1 pairs never fit the byte cap, whatever the number: refused without waiting for the end.
    expect(parseDataPreamble(over)).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(over.subarray(0, DATA_PREAMBLE_MAX_BYTES))).toMatchObject({ kind: 'bad' });
  });

  it('refuses what is not a preamble, and a line over its cap without waiting for more', () => {
    const pair = `${'a'.repeat(16)}:${'b'.repeat(64)}`;
    expect(parseDataPreamble(Buffer.from('GWDATA1 zz 1 00\n'))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.from(`GWDATA1 0 ${pair}\n`))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.from(`GWDATA1 99999999999999999 ${pair}\n`))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.from('GWDATA1 5\n'))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.from(`GWDATA1 5 ${pair}  ${pair}\n`))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.from(`GWDATA1 5 ${'a'.repeat(16)} ${'b'.repeat(64)}\n`))).toMatchObject({ kind: 'bad' });
    expect(parseDataPreamble(Buffer.alloc(DATA_PREAMBLE_MAX_BYTES, 0x41))).toMatchObject({ kind: 'bad', why: expect.stringContaining(String(DATA_PREAMBLE_MAX_BYTES)) });
    expect(parseDataPreamble(Buffer.alloc(DATA_PREAMBLE_MAX_BYTES - 1, 0x41))).toEqual({ kind: 'need-more' });
  });
});

describe('the stream line (GWE2E1)', () => {
  const proxy = ec();

  it('parses incrementally; what follows the line is the TLS, left for the agent', () => {
    const token = signGrant(grant(), proxy.privateKey);
    const line = e2eLine(token);
    expect(line.toString('latin1')).toBe(`GWE2E1 ${token}\n`);
    const whole = Buffer.concat([line, Buffer.from([0x16, 0x03, 0x01])]);
    for (let i = 0; i < line.length; i++) expect(parseE2ELine(whole.subarray(0, i))).toEqual({ kind: 'need-more' });
    expect(parseE2ELine(whole)).toEqual({ kind: 'ok', token, length: line.length });
  });

  it('takes a token of exactly GRANT_TOKEN_MAX_BYTES; refuses a longer line at the cap without waiting for its newline', () => {
    const biggest = `${'a'.repeat(GRANT_TOKEN_MAX_BYTES - 2)}.b`;
    expect(parseE2ELine(e2eLine(biggest))).toMatchObject({ kind: 'ok', token: biggest, length: E2E_LINE_MAX_BYTES });
    const over = e2eLine(`${'a'.repeat(GRANT_TOKEN_MAX_BYTES - 1)}.b`);
    expect(parseE2ELine(over)).toMatchObject({ kind: 'bad', why: expect.stringContaining(String(E2E_LINE_MAX_BYTES)) });
    // No newline, ever: refused once the cap is in, with what is buffered bounded by it.
    const endless = Buffer.concat([Buffer.from('GWE2E1 '), Buffer.alloc(E2E_LINE_MAX_BYTES, 0x61)]);
    expect(parseE2ELine(endless.subarray(0, E2E_LINE_MAX_BYTES - 1))).toEqual({ kind: 'need-more' });
    expect(parseE2ELine(endless.subarray(0, E2E_LINE_MAX_BYTES))).toMatchObject({ kind: 'bad' });
    expect(parseE2ELine(endless)).toMatchObject({ kind: 'bad' });
  });

  it('refuses bad characters, a token not of two parts, another magic, and says so at the first wrong byte', () => {
    for (const bad of ['GWE2E1 a.b c\n', 'GWE2E1 a.b\r\n', 'GWE2E1 ab\n', 'GWE2E1 a.b.c\n', 'GWE2E1 \n', 'GWE2E1 a.b\u0000\n', 'GWE2E1 a+b.c\n']) {
      expect(parseE2ELine(Buffer.from(bad, 'latin1')), JSON.stringify(bad)).toMatchObject({ kind: 'bad' });
    }
    expect(parseE2ELine(Buffer.from('GWDATA1 '))).toMatchObject({ kind: 'bad' });
    expect(parseE2ELine(Buffer.from('GWX'))).toMatchObject({ kind: 'bad' });
    expect(parseE2ELine(Buffer.from('GWE2'))).toEqual({ kind: 'need-more' });
  });

  it("a grant's x5c and trace fields are bounded and printable", () => {
    expect(decodeGrant(signGrant(grant({ x5c: 'AAAA', traceparent: '00-aa-bb-01' }), proxy.privateKey)).ok).toBe(true);
    expect(decodeGrant(signGrant(grant({ x5c: 'not base64url!' }), proxy.privateKey))).toMatchObject({ ok: false, why: expect.stringContaining('x5c') });
    expect(decodeGrant(signGrant(grant({ x5c: 'A'.repeat(6001) }), proxy.privateKey))).toMatchObject({ ok: false });
    expect(decodeGrant(signGrant(grant({ traceparent: 'a\nb' }), proxy.privateKey))).toMatchObject({ ok: false, why: expect.stringContaining('traceparent') });
  });
});

describe("the Proxy's answer to a data preamble", () => {
  it('is "GWDATA1 ok <host ID>" or "GWDATA1 no <reason>", parsed incrementally; the bytes behind it are not its', () => {
    const ok = dataAnswer({ ok: true, proxy: '5c0ffee0-0000-4000-8000-000000000001' });
    expect(ok.toString('latin1')).toBe('GWDATA1 ok 5c0ffee0-0000-4000-8000-000000000001\n');
    const whole = Buffer.concat([ok, Buffer.from([0x16, 0x03, 0x01])]);
    for (let i = 0; i < ok.length; i++) expect(parseDataAnswer(whole.subarray(0, i))).toEqual({ kind: 'need-more' });
    expect(parseDataAnswer(whole)).toEqual({ kind: 'answer', length: ok.length, answer: { ok: true, proxy: '5c0ffee0-0000-4000-8000-000000000001' } });
    expect(parseDataAnswer(dataAnswer({ ok: false, reason: 'pool-full' }))).toMatchObject({ answer: { ok: false, reason: 'pool-full' } });
  });

  it('refuses anything else, and a line over its cap without waiting for more', () => {
    for (const bad of ['GWDATA1 ok\n', 'GWDATA1 ok a b\n', 'GWDATA1 yes p\n', 'GWDATA1 no Pool_Full\n', 'HTTP/1.1 200 OK\n', 'GWDATA1 ok \u00e9\n']) {
      expect(parseDataAnswer(Buffer.from(bad, 'latin1'))).toMatchObject({ kind: 'bad' });
    }
    expect(parseDataAnswer(Buffer.alloc(DATA_ANSWER_MAX_BYTES, 0x41))).toMatchObject({ kind: 'bad' });
    expect(parseDataAnswer(Buffer.alloc(DATA_ANSWER_MAX_BYTES - 1, 0x41))).toEqual({ kind: 'need-more' });
    expect(() => dataAnswer({ ok: true, proxy: 'a b' })).toThrow(RangeError);
    expect(() => dataAnswer({ ok: false, reason: 'no\nGWDATA1 ok x' })).toThrow(RangeError);
  });
});

describe('control messages and the capability', () => {
  it('e2e-open: a data connection number, a token, the addresses', () => {
    const good = { type: 'e2e-open', conn: 3, grant: 'a.b', client_src: '10.0.0.1:5000', client_dst: '10.0.0.2:443' };
    expect(badE2EOpen(good)).toBeUndefined();
    expect(badE2EOpen({ ...good, conn: 0 })).toBeDefined();
    expect(badE2EOpen({ ...good, conn: 1.5 })).toBeDefined();
    expect(badE2EOpen({ ...good, grant: 'x'.repeat(9000) })).toBeDefined();
    expect(badE2EOpen({ ...good, client_src: '' })).toBeDefined();
  });

  it("the hello's e2e field: version 1 with a pool, capped", () => {
    expect(e2eCapabilityOf({ v: 1, pool: 2 })).toEqual({ v: 1, pool: 2 });
    expect(e2eCapabilityOf({ v: 1, pool: 1000 })).toEqual({ v: 1, pool: DATA_POOL_MAX });
    for (const bad of [undefined, null, 'yes', { v: 2, pool: 2 }, { v: 1, pool: 0 }, { v: 1, pool: '2' }]) expect(e2eCapabilityOf(bad)).toBeUndefined();
  });
});
