/**
 * Server-certificate failures against real TLS servers on loopback: each kind gets its own code, a message naming
 * the address dialled (and, for a name mismatch, every name the certificate holds) and the hint that fixes it;
 * where the fix can be applied here, the test applies it and the same call succeeds.
 */
import https from 'node:https';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';
import { ApiClient } from '../../src/client/api.js';
import { Dialer } from '../../src/dial/dialer.js';
import { certNames, chainRoot, looksInspected, tlsVerifyError } from '../../src/dial/tlsverify.js';
import type { PresentedCert } from '../../src/stream/tls.js';
import { IDENTITY_OID_DER, LEGACY_IDENTITY_OID_DER } from '../../src/wire/certs.js';
import { GatewayError } from '../../src/errors.js';
import { failureOf } from '../helpers/errors.js';

const HOST = '127.0.0.7';
const DAY = 24 * 3600_000;

let ca: CertAuthority;
let otherCa: CertAuthority;
let server: https.Server;
let port: number;
const dialer = new Dialer({ env: {} });

async function cert(options: { dns?: string[]; ips?: string[]; authority?: CertAuthority; at?: number; ttlMs?: number } = {}): Promise<{ key: string; cert: string }> {
  const authority = options.authority ?? ca;
  const keys = generateKeyPair();
  const pem = await issueTlsCert(authority, {
    publicKeyPem: keys.publicKeyPem,
    identity: { kind: 'host', name: 'proxy', cluster: authority.clusterName, roles: ['proxy'] },
    dnsNames: options.dns ?? ['proxy.gw.test', '*.proxy.gw.test', 'localhost'],
    ipAddresses: options.ips ?? ['127.0.0.1', '::1'],
    ttlMs: options.ttlMs ?? DAY,
    usage: 'server',
    ...(options.at === undefined ? {} : { clock: () => options.at! }),
  });
  return { key: keys.privateKeyPem, cert: pem };
}

const failure = (call: () => Promise<unknown>): Promise<GatewayError> => failureOf(call);

const api = (trust?: string) => new ApiClient({ address: `${HOST}:${port}`, dialer, ...(trust ? { ca: trust } : {}) });

beforeAll(async () => {
  const past = Date.now() - 30 * DAY;
  ca = await generateAuthority('host', 'tls.example', { clock: () => past });
  otherCa = await generateAuthority('host', 'other.example');
  server = https.createServer(await cert(), (_req, res) => res.end('{"ok":true}'));
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  port = (server.address() as net.AddressInfo).port;
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe('a certificate that does not hold the address dialled', () => {
  it('is GW_ERR_TLS_NAME_MISMATCH naming the address and every DNS and IP name of the certificate', async () => {
    server.setSecureContext(await cert());
    const err = await failure(() => api(ca.tls.certPem).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_TLS_NAME_MISMATCH');
    expect(err.message).toContain(`${HOST}:${port}`);
    expect(err.message).toContain(`IP address ${HOST}`);
    for (const name of ['proxy.gw.test', '*.proxy.gw.test', 'localhost', '127.0.0.1', '::1']) expect(err.message).toContain(name);
    expect(err.hint).toContain(`proxy_service.public_addr on the Proxy to include ${HOST}:${port}`);
    expect(err.hint).toContain('restart');
    expect(err.hint).toContain(`e.g. proxy.gw.test:${port}`);
    expect(err.details).toMatchObject({ dns_names: ['proxy.gw.test', '*.proxy.gw.test', 'localhost'], ip_addresses: ['127.0.0.1', '::1'] });
  });

  it('names the Auth Service setting when the Auth Service answered', async () => {
    const err = await failure(() => new ApiClient({ address: `${HOST}:${port}`, dialer, ca: ca.tls.certPem, server: 'auth' }).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_TLS_NAME_MISMATCH');
    expect(err.hint).toContain('auth_service.public_addr');
  });

  it('following the hint (a certificate reissued with the address among its names) makes the same call work', async () => {
    server.setSecureContext(await cert({ ips: ['127.0.0.1', '::1', HOST] }));
    expect(await api(ca.tls.certPem).call('GET', '/')).toEqual({ ok: true });
  });
});

describe('a certificate no trusted CA signed', () => {
  it('without a CA given, the hint is the pin', async () => {
    server.setSecureContext(await cert({ ips: [HOST] }));
    const err = await failure(() => api().call('GET', '/'));
    expect(err.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
    expect(err.message).toContain(`${HOST}:${port}`);
    expect(err.hint).toContain('--ca-pin');
  });

  it("with the cluster CA, another cluster's certificate is not trusted, and the hint says why", async () => {
    server.setSecureContext(await cert({ ips: [HOST], authority: otherCa }));
    const err = await failure(() => api(ca.tls.certPem).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
    expect(err.hint).toContain('not signed by the cluster CA');
    expect(err.hint).toContain('--ca-pin');
  });
});

describe('a certificate outside its validity', () => {
  it('is GW_ERR_TLS_CERT_EXPIRED; a freshly issued one (what a restart of the Proxy does) works', async () => {
    server.setSecureContext(await cert({ ips: [HOST], at: Date.now() - 2 * DAY, ttlMs: 3600_000 }));
    const err = await failure(() => api(ca.tls.certPem).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_TLS_CERT_EXPIRED');
    expect(err.message).toBe(`the certificate of ${HOST}:${port} has expired`);
    expect(err.hint).toContain('restarting it issues a fresh one');
    server.setSecureContext(await cert({ ips: [HOST] }));
    expect(await api(ca.tls.certPem).call('GET', '/')).toEqual({ ok: true });
  });
});

describe('tlsVerifyError', () => {
  it('gives a Kubernetes API server the kube_service settings', async () => {
    server.setSecureContext(await cert({ dns: ['k8s.internal'], ips: [] }));
    const err = await new Promise<Error>((resolve) => {
      const socket = tls.connect({ host: HOST, port, ca: ca.tls.certPem });
      socket.once('error', resolve);
      socket.once('secureConnect', () => resolve(new Error('connected')));
    });
    const e = tlsVerifyError(err, { address: `${HOST}:${port}`, server: 'kube-api', name: 'dev' });
    expect(e?.code).toBe('GW_ERR_TLS_NAME_MISMATCH');
    expect(e?.hint).toContain('kube_service.clusters[].api_server of "dev"');
    expect(e?.hint).toContain(`https://k8s.internal:${port}`);
  });

  it('leaves other errors to the caller', () => {
    expect(tlsVerifyError(Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }), { address: 'a:1', server: 'proxy' })).toBeUndefined();
  });

  it('reads the names Node reports, IPv6 compressed', () => {
    expect(certNames({ subjectaltname: 'DNS:a.example, DNS:*.b.example, IP Address:10.0.0.1, IP Address:0:0:0:0:0:0:0:1, URI:spiffe://x' })).toEqual({
      dns: ['a.example', '*.b.example'],
      ips: ['10.0.0.1', '::1'],
    });
    expect(certNames(undefined)).toEqual({ dns: [], ips: [] });
  });
});

describe('the inspection verdict (looksInspected, chainRoot: the judgement behind GW_ERR_TLS_INSPECTED and the probe)', () => {
  const cert = (subject: string, issuer: string): PresentedCert => ({ subject, issuer, selfIssued: subject === issuer, fingerprint256: subject, raw: Buffer.alloc(0) });
  const leaf = cert('CN=proxy.gw.test', 'CN=Corp Issuing CA');
  const proxied = { proxy: { display: 'http://squid.corp:3128', source: 'HTTPS_PROXY' } };

  it('the root named is the top certificate itself when it signed itself, else the issuer of the last one sent', () => {
    expect(chainRoot([leaf])).toBe('CN=Corp Issuing CA');
    expect(chainRoot([leaf, cert('CN=Corp Issuing CA', 'CN=Corp Root CA')])).toBe('CN=Corp Root CA');
    expect(chainRoot([leaf, cert('CN=Corp Root CA', 'CN=Corp Root CA')])).toBe('CN=Corp Root CA');
    expect(chainRoot([])).toBeUndefined();
  });

  it.each([
    ['through a proxy, a leaf another CA issued', [leaf], proxied, true],
    ['dialled directly', [leaf], { proxy: null }, false],
    ['a stream the Dialer did not make (route unknown)', [leaf], undefined, false],
    ['through a proxy, a self-signed leaf (the proxy only tunnelled)', [cert('CN=x', 'CN=x')], proxied, false],
    ['through a proxy, nothing presented', [], proxied, false],
    // Another cluster's Proxy behind a proxy that only tunnels: a gateway certificate, not an inspecting proxy's.
    ['through a proxy, a leaf that carries a gateway identity', [{ ...leaf, raw: Buffer.concat([Buffer.from('3082', 'hex'), IDENTITY_OID_DER, Buffer.from('0400', 'hex')]) }], proxied, false],
    ['through a proxy, a leaf that carries a gateway identity under the old OID (issued before the move)', [{ ...leaf, raw: Buffer.concat([Buffer.from('3082', 'hex'), LEGACY_IDENTITY_OID_DER, Buffer.from('0400', 'hex')]) }], proxied, false],
  ] as const)('%s: %s', (_what, chain, route, expected) => {
    expect(looksInspected(chain, route)).toBe(expected);
  });
});
