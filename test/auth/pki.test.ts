/**
 * The cluster PKI against real tools: openssl (chain, pin, certificate fields), Node's TLS stack (mutual TLS),
 * ssh-keygen and sshpk (OpenSSH certificates), ssh2 (private key). Plus a property test for the identity
 * round trip and the file helpers.
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync, randomUUID, X509Certificate } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tls from 'node:tls';
import { promisify } from 'node:util';
import fc from 'fast-check';
import ssh2 from 'ssh2';
import sshpk from 'sshpk';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  caPin,
  checkHostCert,
  DEFAULT_USER_EXTENSIONS,
  generateAuthority,
  generateKeyPair,
  bearsIdentity,
  identityFromCert,
  IDENTITY_EXTENSION_OID,
  LEGACY_IDENTITY_EXTENSION_OID,
  issueSshCert,
  issueTlsCert,
  parseSshCert,
  pinMatches,
  sshPrivateKeyPem,
  sshPublicKeyFromPem,
  verifyCert,
  type CertAuthority,
  type Identity,
  type KeyPair,
} from '../../src/auth/pki.js';
import { isGatewayError, type GatewayError } from '../../src/errors.js';
import { readIfExists, writePublicFile, writeSecretFile } from '../../src/fsutil.js';
import { codeOf, codeOfSync } from '../helpers/errors.js';

const run = promisify(execFile);
const HOUR = 3600_000;
const T0 = Date.UTC(2030, 0, 2, 3, 4, 5); // a fixed clock for certificates whose fields are compared

let dir: string;
let hostCa: CertAuthority;
let userCa: CertAuthority;
let otherUserCa: CertAuthority;
let keys: KeyPair;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'gw-pki-test-'));
  [hostCa, userCa, otherUserCa] = await Promise.all([
    generateAuthority('host', 'example.com'),
    generateAuthority('user', 'example.com'),
    generateAuthority('user', 'other.example.net'),
  ]);
  keys = generateKeyPair();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let fileNo = 0;
function file(content: string, mode = 0o600): string {
  const path = join(dir, `f${++fileNo}`);
  writeFileSync(path, content, { mode }); // 0600: ssh-keygen refuses private keys others can read
  return path;
}

async function sh(script: string, env: Record<string, string> = {}): Promise<string> {
  const { stdout } = await run('bash', ['-o', 'pipefail', '-c', script], { env: { ...process.env, ...env } });
  return stdout;
}


const hostIdentity = (name = randomUUID()): Identity => ({
  kind: 'host',
  name,
  cluster: 'example.com',
  roles: ['node', 'proxy'],
  nodename: 'node-1.example.com',
});
const userIdentity = (name = 'alice'): Identity => ({
  kind: 'user',
  name,
  cluster: 'example.com',
  roles: ['access', 'editor'],
  logins: ['alice', 'root'],
});

describe('key pairs', () => {
  it('are ECDSA P-256 in PKCS#8 / SPKI PEM with a one-line OpenSSH public key', async () => {
    expect(keys.privateKeyPem).toMatch(/^-----BEGIN PRIVATE KEY-----\n/);
    expect(keys.publicKeyPem).toMatch(/^-----BEGIN PUBLIC KEY-----\n/);
    expect(keys.sshPublicKey).toMatch(/^ecdsa-sha2-nistp256 AAAA[A-Za-z0-9+/]+=*$/);
    expect(sshPublicKeyFromPem(keys.publicKeyPem)).toBe(keys.sshPublicKey);
    expect(sshPublicKeyFromPem(keys.privateKeyPem)).toBe(keys.sshPublicKey);
    // OpenSSH derives the same public key from the private key.
    const fromOpenssh = await sh(`ssh-keygen -y -f ${file(keys.privateKeyPem)}`);
    const line = fromOpenssh.trim().split(/\s+/).slice(0, 2).join(' ');
    expect(line).toBe(keys.sshPublicKey);
    expect(await sh(`ssh-keygen -l -f ${file(`${keys.sshPublicKey}\n`)}`)).toMatch(/^256 SHA256:\S+ .*\(ECDSA\)/);
  });

  it('never export a key as JWK (Node 20 deadlocks when a GC hits the JWK export of a generated key)', async () => {
    // KeyObject.export({ format: 'jwk' }) of a key from generateKeyPairSync hangs Node 20 for good if a garbage
    // collection runs during the export (seen here: a 20000-iteration loop hangs every time). The PKI goes through
    // SPKI DER instead; this checks that no code path of it asks for JWK.
    const sample = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
    const spies = [Object.getPrototypeOf(sample.publicKey), Object.getPrototypeOf(sample.privateKey)].map((proto) =>
      vi.spyOn(proto as { export: (o?: unknown) => unknown }, 'export'),
    );
    try {
      const kp = generateKeyPair();
      const ca = await generateAuthority('user', 'example.com');
      await issueTlsCert(ca, { publicKeyPem: kp.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client' });
      const line = issueSshCert(ca, { publicKey: kp.sshPublicKey, certType: 'user', keyId: 'a', principals: ['a'], ttlMs: HOUR });
      parseSshCert(line, ca.ssh.publicKey);
      sshPublicKeyFromPem(kp.privateKeyPem);
      sshPrivateKeyPem(kp.privateKeyPem);
      const calls = spies.flatMap((spy) => spy.mock.calls);
      expect(calls.length).toBeGreaterThan(0);
      expect(calls.filter(([options]) => (options as { format?: string } | undefined)?.format === 'jwk')).toEqual([]);
    } finally {
      for (const spy of spies) spy.mockRestore();
    }
  });

  it('ssh2 parses the private key (as SEC1: ssh2 does not read PKCS#8) and sees the same public key', () => {
    const parsed = ssh2.utils.parseKey(sshPrivateKeyPem(keys.privateKeyPem));
    if (parsed instanceof Error || Array.isArray(parsed)) throw new Error('ssh2 could not parse the key');
    expect(parsed.type).toBe('ecdsa-sha2-nistp256');
    expect(parsed.getPublicSSH().toString('base64')).toBe(keys.sshPublicKey.split(' ')[1]);
    const parsedPublic = ssh2.utils.parseKey(keys.sshPublicKey);
    expect(parsedPublic).not.toBeInstanceOf(Error);
  });

  it('a garbled key is GW_ERR_PKI_BAD_KEY and no key text reaches the error', async () => {
    const lines = keys.privateKeyPem.split('\n');
    lines[1] = `GARBLED${(lines[1] as string).slice(7)}`; // breaks the DER header, keeps valid base64
    const secret = lines.join('\n');
    for (const attempt of [
      () => sshPrivateKeyPem(secret),
      () => sshPublicKeyFromPem(secret),
      () => issueSshCert({ ...userCa, ssh: { ...userCa.ssh, privateKeyPem: secret } }, {
        publicKey: keys.sshPublicKey, certType: 'user', keyId: 'alice', principals: ['alice'], ttlMs: HOUR,
      }),
    ]) {
      try {
        attempt();
        throw new Error('expected an error');
      } catch (err) {
        if (!isGatewayError(err)) throw err;
        expect(err.code).toBe('GW_ERR_PKI_BAD_KEY');
        const shown = `${err.message} ${err.hint} ${JSON.stringify(err.details)} ${JSON.stringify(err)}`;
        expect(shown).not.toContain('GARBLED');
        expect(shown).not.toContain('PRIVATE KEY');
        for (const line of secret.split('\n').filter((l) => l.length > 20)) expect(shown).not.toContain(line);
      }
    }
    const err = await issueTlsCert({ ...hostCa, tls: { ...hostCa.tls, keyPem: secret } }, {
      publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), ttlMs: HOUR, usage: 'server',
    }).catch((e: unknown) => e);
    expect(isGatewayError(err, 'GW_ERR_PKI_BAD_KEY')).toBe(true);
    expect(String((err as Error).message)).not.toContain('GARBLED');
  });

  it("refuses a CA whose private key does not match its certificate", async () => {
    const swapped = { ...hostCa, tls: { ...hostCa.tls, keyPem: userCa.tls.keyPem } };
    expect(await codeOf(() => issueTlsCert(swapped, {
      publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), ttlMs: HOUR, usage: 'server',
    }))).toBe('GW_ERR_PKI_BAD_KEY');
    const swappedSsh = { ...userCa, ssh: { ...userCa.ssh, publicKey: hostCa.ssh.publicKey } };
    expect(codeOfSync(() => issueSshCert(swappedSsh, {
      publicKey: keys.sshPublicKey, certType: 'user', keyId: 'a', principals: ['a'], ttlMs: HOUR,
    }))).toBe('GW_ERR_PKI_BAD_KEY');
  });
});

describe('X.509 certificate authorities', () => {
  it('are self-signed CAs: CA:TRUE critical, keyCertSign + cRLSign, subject CN=<cluster> <type> CA, O=<cluster>', async () => {
    const ca = await generateAuthority('user', 'example.com', { clock: () => T0, ttlMs: 24 * HOUR });
    expect(ca.type).toBe('user');
    expect(ca.clusterName).toBe('example.com');
    const path = file(ca.tls.certPem);
    const text = await sh(`openssl x509 -in ${path} -noout -text`);
    expect(text).toMatch(/X509v3 Basic Constraints: critical\s+CA:TRUE/);
    expect(text).toMatch(/X509v3 Key Usage: critical\s+Certificate Sign, CRL Sign/);
    expect(text).toMatch(/X509v3 Subject Key Identifier/);
    expect(text).toMatch(/Signature Algorithm: ecdsa-with-SHA256/);
    expect(text).toMatch(/ASN1 OID: prime256v1/);
    const subject = await sh(`openssl x509 -in ${path} -noout -subject -nameopt RFC2253`);
    expect(subject.trim()).toBe('subject=CN=example.com user CA,O=example.com');
    const issuer = await sh(`openssl x509 -in ${path} -noout -issuer -nameopt RFC2253`);
    expect(issuer.trim()).toBe('issuer=CN=example.com user CA,O=example.com');
    const x = new X509Certificate(ca.tls.certPem);
    expect(x.ca).toBe(true);
    expect(Date.parse(x.validFrom)).toBe(T0 - 60_000);
    expect(Date.parse(x.validTo)).toBe(T0 + 24 * HOUR);
    // Self-signed, and the SSH CA is a separate P-256 key.
    expect(await sh(`openssl verify -no_check_time -CAfile ${path} ${path}`)).toContain(': OK');
    expect(ca.ssh.publicKey).toMatch(/^ecdsa-sha2-nistp256 /);
    expect(sshPublicKeyFromPem(ca.ssh.privateKeyPem)).toBe(ca.ssh.publicKey);
    expect(sshPublicKeyFromPem(ca.tls.keyPem)).not.toBe(ca.ssh.publicKey);
  });

  it('default to a 10-year lifetime', async () => {
    const x = new X509Certificate(hostCa.tls.certPem);
    const years = (Date.parse(x.validTo) - Date.parse(x.validFrom)) / (365 * 24 * HOUR);
    expect(years).toBeGreaterThan(9.99);
    expect(years).toBeLessThan(10.01);
  });

  it('refuse bad arguments with GW_ERR_PKI_BAD_REQUEST', async () => {
    expect(await codeOf(() => generateAuthority('admin' as 'host', 'x'))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(await codeOf(() => generateAuthority('host', ''))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(await codeOf(() => generateAuthority('host', 'a\nb'))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(await codeOf(() => generateAuthority('host', 'x', { ttlMs: 0 }))).toBe('GW_ERR_PKI_BAD_REQUEST');
  });
});

describe('X.509 leaf certificates', () => {
  it('chain to their CA under `openssl verify`, with the purpose their usage allows', async () => {
    const ca = file(hostCa.tls.certPem);
    const server = await issueTlsCert(hostCa, {
      publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), dnsNames: ['localhost'], ttlMs: HOUR, usage: 'server',
    });
    const client = await issueTlsCert(userCa, {
      publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client',
    });
    const both = await issueTlsCert(hostCa, {
      publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), ttlMs: HOUR, usage: 'both',
    });
    const s = file(server);
    const c = file(client);
    const b = file(both);
    const uca = file(userCa.tls.certPem);
    expect(await sh(`openssl verify -CAfile ${ca} ${s}`)).toBe(`${s}: OK\n`);
    expect(await sh(`openssl verify -purpose sslserver -CAfile ${ca} ${s}`)).toBe(`${s}: OK\n`);
    expect(await sh(`openssl verify -purpose sslclient -CAfile ${uca} ${c}`)).toBe(`${c}: OK\n`);
    expect(await sh(`openssl verify -purpose sslclient -CAfile ${ca} ${b} && openssl verify -purpose sslserver -CAfile ${ca} ${b}`)).toBe(`${b}: OK\n${b}: OK\n`);
    await expect(sh(`openssl verify -purpose sslclient -CAfile ${ca} ${s}`)).rejects.toThrow(/unsuitable certificate purpose/);
    await expect(sh(`openssl verify -purpose sslserver -CAfile ${uca} ${c}`)).rejects.toThrow(/unsuitable certificate purpose/);
    // Another cluster's CA, or the other CA of this cluster, does not verify it.
    await expect(sh(`openssl verify -CAfile ${uca} ${s}`)).rejects.toThrow(/unable to get local issuer certificate/);
    await expect(sh(`openssl verify -CAfile ${file(otherUserCa.tls.certPem)} ${c}`)).rejects.toThrow(/unable to get local issuer/);
  });

  it('hold the identity: CN, O, SANs, usages, key identifiers, a 16-byte serial, notBefore one minute early', async () => {
    const identity = hostIdentity('2b1c47d6-3d55-4bb1-9a39-2f7b1b5dfe3a');
    const pem = await issueTlsCert(hostCa, {
      publicKeyPem: keys.publicKeyPem,
      identity,
      dnsNames: ['node-1.example.com', '*.node-1.example.com'],
      ipAddresses: ['10.1.2.3', '2001:db8::7', '::ffff:192.0.2.1'],
      ttlMs: 2 * HOUR,
      usage: 'both',
      clock: () => T0,
    });
    const path = file(pem);
    const text = await sh(`openssl x509 -in ${path} -noout -text`);
    expect(text).toMatch(/X509v3 Basic Constraints: critical\s+CA:FALSE/);
    expect(text).toMatch(/X509v3 Key Usage: critical\s+Digital Signature\n/);
    expect(text).toMatch(/X509v3 Extended Key Usage: \s+TLS Web Server Authentication, TLS Web Client Authentication/);
    expect(text).toContain(
      'DNS:node-1.example.com, DNS:*.node-1.example.com, IP Address:10.1.2.3, IP Address:2001:DB8:0:0:0:0:0:7, IP Address:0:0:0:0:0:FFFF:C000:201',
    );
    expect(text).toContain(`${IDENTITY_EXTENSION_OID}: \n`);
    expect(text).toContain(JSON.stringify(identity)); // compact JSON, readable in the dump
    expect(text).toMatch(/Signature Algorithm: ecdsa-with-SHA256/);
    const subject = await sh(`openssl x509 -in ${path} -noout -subject -nameopt RFC2253`);
    expect(subject.trim()).toBe(`subject=CN=${identity.name},O=example.com`);
    const issuer = await sh(`openssl x509 -in ${path} -noout -issuer -nameopt RFC2253`);
    expect(issuer.trim()).toBe('issuer=CN=example.com host CA,O=example.com');

    const ski = (t: string) => /Subject Key Identifier: \s+([0-9A-F:]+)/.exec(t)?.[1];
    const aki = /Authority Key Identifier: \s+(?:keyid:)?([0-9A-F:]+)/.exec(text)?.[1];
    const caText = await sh(`openssl x509 -in ${file(hostCa.tls.certPem)} -noout -text`);
    expect(aki).toBeDefined();
    expect(aki).toBe(ski(caText));
    expect(ski(text)).not.toBe(ski(caText));

    const x = new X509Certificate(pem);
    expect(x.serialNumber).toMatch(/^[4-7][0-9A-F]{31}$/);
    expect(Date.parse(x.validFrom)).toBe(T0 - 60_000);
    expect(Date.parse(x.validTo)).toBe(T0 + 2 * HOUR);
    expect(x.checkIssued(new X509Certificate(hostCa.tls.certPem))).toBe(true);
    expect(identityFromCert(pem)).toEqual(identity);
    expect(identityFromCert(x.raw)).toEqual(identity);
  });

  it('gets a fresh serial every time', async () => {
    const serials = new Set<string>();
    for (let i = 0; i < 5; i++) {
      const pem = await issueTlsCert(userCa, { publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client' });
      serials.add(new X509Certificate(pem).serialNumber);
    }
    expect(serials.size).toBe(5);
  });

  it('never outlive their CA, and an expired CA issues nothing', async () => {
    const ca = await generateAuthority('host', 'short.example.com', { clock: () => T0, ttlMs: 10 * HOUR });
    const pem = await issueTlsCert(ca, {
      publicKeyPem: keys.publicKeyPem, identity: { ...hostIdentity(), cluster: 'short.example.com' }, ttlMs: 100 * HOUR, usage: 'server', clock: () => T0,
    });
    expect(Date.parse(new X509Certificate(pem).validTo)).toBe(T0 + 10 * HOUR);
    expect(await codeOf(() => issueTlsCert(ca, {
      publicKeyPem: keys.publicKeyPem, identity: { ...hostIdentity(), cluster: 'short.example.com' }, ttlMs: HOUR, usage: 'server', clock: () => T0 + 11 * HOUR,
    }))).toBe('GW_ERR_PKI_CA_EXPIRED');
  });

  it.each([
    ['an empty name', { identity: { ...userIdentity(), name: '' } }],
    ['a control character in a role', { identity: { ...userIdentity(), roles: ['ok', 'bad\u0007'] } }],
    ['a newline in a login', { identity: { ...userIdentity(), logins: ['a\nb'] } }],
    ['a lone surrogate', { identity: { ...userIdentity(), name: 'x\ud800' } }],
    ['an unknown kind', { identity: { ...userIdentity(), kind: 'robot' as 'user' } }],
    ['roles that are not a list', { identity: { ...userIdentity(), roles: 'access' as unknown as string[] } }],
    ['a zero TTL', { ttlMs: 0 }],
    ['an infinite TTL', { ttlMs: Infinity }],
    ['a bad usage', { usage: 'sign' as 'server' }],
    ['an IP in dnsNames', { dnsNames: ['10.0.0.1'] }],
    ['a bad DNS name', { dnsNames: ['bad name.example.com'] }],
    ['a bad IP address', { ipAddresses: ['10.0.0.256'] }],
    ['an IPv6 zone', { ipAddresses: ['fe80::1%eth0'] }],
    ['an identity of another cluster', { identity: { ...userIdentity(), cluster: 'other.example.net' } }],
  ])('refuse %s with GW_ERR_PKI_BAD_REQUEST', async (_what, patch) => {
    expect(await codeOf(() => issueTlsCert(userCa, {
      publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client', ...patch,
    }))).toBe('GW_ERR_PKI_BAD_REQUEST');
  });

  it('refuse a subject key that is not a PEM public key with GW_ERR_PKI_BAD_KEY', async () => {
    expect(await codeOf(() => issueTlsCert(userCa, {
      publicKeyPem: keys.sshPublicKey, identity: userIdentity(), ttlMs: HOUR, usage: 'client',
    }))).toBe('GW_ERR_PKI_BAD_KEY');
  });
});

describe('identityFromCert', () => {
  it('reads PEM text and DER bytes', async () => {
    const identity = userIdentity();
    const pem = await issueTlsCert(userCa, { publicKeyPem: keys.publicKeyPem, identity, ttlMs: HOUR, usage: 'client' });
    expect(identityFromCert(pem)).toEqual(identity);
    expect(identityFromCert(new X509Certificate(pem).raw)).toEqual(identity);
    expect(identityFromCert(Buffer.from(pem))).toEqual(identity);
  });

  it.each([
    ['undefined', undefined],
    ['an empty string', ''],
    ['an empty buffer', Buffer.alloc(0)],
    ['garbage', 'not a certificate'],
    ['random bytes', Buffer.from('3082ffff0102030405', 'hex')],
  ])('refuses %s with GW_ERR_AUTH_BAD_CERT', (_what, input) => {
    expect(codeOfSync(() => identityFromCert(input as string))).toBe('GW_ERR_AUTH_BAD_CERT');
  });

  it('refuses a certificate without a gateway identity (a CA certificate, an openssl-made certificate)', async () => {
    expect(codeOfSync(() => identityFromCert(hostCa.tls.certPem))).toBe('GW_ERR_AUTH_BAD_CERT');
    const key = file(keys.privateKeyPem);
    const pem = await sh(`openssl req -x509 -new -key ${key} -subj /CN=alice/O=example.com -days 1 -sha256`);
    expect(codeOfSync(() => identityFromCert(pem))).toBe('GW_ERR_AUTH_BAD_CERT');
  });

  it('refuses an identity extension that is not a valid identity', async () => {
    const key = file(keys.privateKeyPem);
    const make = async (value: string) => {
      // openssl's config parser drops unescaped double quotes
      const cnf = file(`[req]\ndistinguished_name=dn\n[dn]\n[ext]\n${IDENTITY_EXTENSION_OID}=${value.replace(/"/g, '\\"')}\n`);
      return sh(`openssl req -x509 -new -key ${key} -subj /CN=alice -days 1 -config ${cnf} -extensions ext`);
    };
    // UTF8String holding something that is not JSON, JSON of the wrong shape, or a bad field; and not a UTF8String.
    for (const value of [
      'ASN1:UTF8String:not json',
      'ASN1:UTF8String:{"kind":"user"}',
      'ASN1:UTF8String:{"kind":"user","name":"","cluster":"c","roles":[]}',
      'ASN1:UTF8String:{"kind":"root","name":"a","cluster":"c","roles":[]}',
      'ASN1:IA5STRING:{"kind":"user","name":"a","cluster":"c","roles":[]}',
    ]) {
      const pem = await make(value);
      expect(codeOfSync(() => identityFromCert(pem)), value).toBe('GW_ERR_AUTH_BAD_CERT');
    }
    // The same path accepts a well-formed identity: the check above is about content, not about openssl.
    const ok = await make('ASN1:UTF8String:{"kind":"user","name":"a","cluster":"c","roles":[],"extra":1}');
    expect(identityFromCert(ok)).toEqual({ kind: 'user', name: 'a', cluster: 'c', roles: [] });
  });

  describe('the OID migration (docs/pki.md, the identity extension)', () => {
    const alice = '{"kind":"user","name":"alice","cluster":"c","roles":[]}';
    const mallory = '{"kind":"admin","name":"mallory","cluster":"c","roles":[]}';
    const make = async (exts: Array<[string, string]>) => {
      const key = file(keys.privateKeyPem);
      const lines = exts.map(([o, json]) => `${o}=ASN1:UTF8String:${json.replace(/"/g, '\\"')}`).join('\n');
      const cnf = file(`[req]\ndistinguished_name=dn\n[dn]\n[ext]\n${lines}\n`);
      return sh(`openssl req -x509 -new -key ${key} -subj /CN=alice -days 1 -config ${cnf} -extensions ext`);
    };

    it('writes the new OID only, every arc of which fits 31 bits (Go reads it)', async () => {
      expect(IDENTITY_EXTENSION_OID).toBe('1.3.9999.77.1');
      expect(IDENTITY_EXTENSION_OID.split('.').every((a) => Number(a) < 2 ** 31)).toBe(true);
      const pem = await issueTlsCert(userCa, { publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client' });
      const text = await sh(`openssl x509 -in ${file(pem)} -noout -text`);
      expect(text).toContain(`${IDENTITY_EXTENSION_OID}: \n`);
      expect(text).not.toContain(LEGACY_IDENTITY_EXTENSION_OID);
    });

    it('still reads a certificate issued under the old OID', async () => {
      const pem = await make([[LEGACY_IDENTITY_EXTENSION_OID, alice]]);
      expect(identityFromCert(pem)).toEqual({ kind: 'user', name: 'alice', cluster: 'c', roles: [] });
      expect(bearsIdentity(pem)).toBe(true);
      expect(identityFromCert(await make([[IDENTITY_EXTENSION_OID, alice]])).name).toBe('alice');
    });

    it('refuses a certificate carrying both OIDs, with different identities or the same, rather than pick one', async () => {
      for (const pair of [[alice, mallory], [mallory, alice], [alice, alice]]) {
        const pem = await make([[IDENTITY_EXTENSION_OID, pair[0]!], [LEGACY_IDENTITY_EXTENSION_OID, pair[1]!]]);
        expect(() => identityFromCert(pem)).toThrow(/two identities/);
        expect(codeOfSync(() => identityFromCert(pem))).toBe('GW_ERR_AUTH_BAD_CERT');
      }
    });
  });

  const piece = fc.oneof(
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 6 }),
    fc.constantFrom(',', ', ', '"', '\\', '=', '+', ';', '<', '>', '#', ' ', 'é', '日本語', '😀', 'CN=x', '\u2028', '{"a":1}'),
  );
  const text = fc
    .array(piece, { minLength: 1, maxLength: 6 })
    .map((parts) => parts.join(''))
    .filter((s) => s.length > 0 && s.length <= 200 && !/[\u0000-\u001f\u007f-\u009f]/.test(s));
  const identities = fc.record(
    {
      kind: fc.constantFrom('user' as const, 'host' as const, 'admin' as const),
      name: text,
      cluster: text,
      roles: fc.array(text, { maxLength: 5 }),
      nodename: text,
      logins: fc.array(text, { maxLength: 5 }),
    },
    { requiredKeys: ['kind', 'name', 'cluster', 'roles'] },
  );

  it('round-trips any identity (property: unicode, commas, quotes, DN syntax)', async () => {
    await fc.assert(
      fc.asyncProperty(identities, async (identity) => {
        const ca = await generateAuthority(identity.kind === 'host' ? 'host' : 'user', identity.cluster);
        const pem = await issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity, ttlMs: HOUR, usage: 'client' });
        // fast-check builds null-prototype objects; compare with a plain copy (no key may be added or lost)
        expect(identityFromCert(pem)).toStrictEqual({ ...identity });
        expect(identityFromCert(new X509Certificate(pem).raw)).toStrictEqual({ ...identity });
      }),
      { numRuns: 150 },
    );
  });

  it('puts unicode and commas into CN and O verbatim (UTF8String)', async () => {
    const identity: Identity = { kind: 'user', name: 'Zoë, "the" admin+ops', cluster: 'clüster, inc', roles: [] };
    const ca = await generateAuthority('user', identity.cluster);
    const pem = await issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity, ttlMs: HOUR, usage: 'client' });
    const subject = await sh(`openssl x509 -in ${file(pem)} -noout -subject -nameopt utf8,sep_multiline,lname`);
    expect(subject).toContain('    commonName=Zoë, "the" admin+ops\n');
    expect(subject).toContain('    organizationName=clüster, inc\n');
  });
});

describe('bearsIdentity', () => {
  it('finds the identity extension in PEM text and DER bytes', async () => {
    const pem = await issueTlsCert(hostCa, { publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), ttlMs: HOUR, usage: 'server', dnsNames: ['a.example.com'] });
    expect(bearsIdentity(pem)).toBe(true);
    expect(bearsIdentity(new X509Certificate(pem).raw)).toBe(true);
    expect(bearsIdentity(hostCa.tls.certPem)).toBe(false);
    expect(bearsIdentity(undefined)).toBe(false);
    expect(bearsIdentity('not a certificate')).toBe(false);
  });

  it("does not count the OID's bytes outside the extension list (a subject attribute, another extension's value)", async () => {
    const key = file(keys.privateKeyPem);
    // The identity OID as a subject (and so issuer) attribute type, and its DER (06 len ...) as the value of a
    // private extension: three times in the certificate, never as an extension's ID.
    const oidDer = (await sh(`openssl asn1parse -genstr OID:${IDENTITY_EXTENSION_OID} -out /dev/stdout -noout | xxd -p | tr -d '\\n'`)).trim();
    const config = file(`oid_section = ids\n[ids]\ngwIdentity = ${IDENTITY_EXTENSION_OID}\n[req]\ndistinguished_name = dn\n[dn]\n`);
    const pem = await sh(`openssl req -x509 -new -key ${key} -config ${config} -subj '/CN=look-alike/gwIdentity=x' -addext '1.3.6.1.4.1.99999.1=DER:${oidDer}' -days 1 -sha256`);
    const der = new X509Certificate(pem).raw;
    const times = (needle: Buffer) => {
      let n = 0;
      for (let i = der.indexOf(needle); i >= 0; i = der.indexOf(needle, i + 1)) n++;
      return n;
    };
    expect(times(Buffer.from(oidDer, 'hex'))).toBe(3);
    expect(bearsIdentity(pem)).toBe(false);
    expect(bearsIdentity(der)).toBe(false);
  });

  it("searches DER the reader cannot follow for the OID's bytes (the stricter check then decides)", async () => {
    const pem = await issueTlsCert(hostCa, { publicKeyPem: keys.publicKeyPem, identity: hostIdentity(), ttlMs: HOUR, usage: 'server', dnsNames: ['a.example.com'] });
    const cut = (p: string) => new X509Certificate(p).raw.subarray(0, -1); // the outer length now runs past the end
    expect(bearsIdentity(cut(pem))).toBe(true);
    expect(bearsIdentity(cut(hostCa.tls.certPem))).toBe(false);
  });
});

describe('verifyCert', () => {
  it('accepts a certificate of this CA within its validity period', async () => {
    const pem = await issueTlsCert(userCa, { publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client' });
    expect(await verifyCert(pem, userCa.tls.certPem)).toBeUndefined();
  });

  it('refuses an expired certificate (injected clock) with a reason', async () => {
    const ca = await generateAuthority('user', 'example.com', { clock: () => Date.now() - 24 * HOUR });
    const pem = await issueTlsCert(ca, {
      publicKeyPem: keys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'client', clock: () => Date.now() - 2 * HOUR,
    });
    expect(await verifyCert(pem, ca.tls.certPem)).toMatch(/^the certificate expired at \d{4}-\d\d-\d\dT/);
    // ... which openssl confirms.
    await expect(sh(`openssl verify -CAfile ${file(ca.tls.certPem)} ${file(pem)}`)).rejects.toThrow(/certificate has expired/);
    // The clock is injectable on the verifying side too.
    expect(await verifyCert(pem, ca.tls.certPem, Date.now() - 90 * 60_000)).toBeUndefined();
    expect(await verifyCert(pem, ca.tls.certPem, Date.now() - 4 * HOUR)).toMatch(/^the certificate is not valid before/);
    expect(await verifyCert(pem, ca.tls.certPem, Date.now() - 25 * HOUR)).toMatch(/^the CA certificate is not valid before/);
  });

  it('refuses a certificate of another CA, and a leaf posing as a CA', async () => {
    const pem = await issueTlsCert(otherUserCa, {
      publicKeyPem: keys.publicKeyPem, identity: { ...userIdentity(), cluster: 'other.example.net' }, ttlMs: HOUR, usage: 'client',
    });
    expect(await verifyCert(pem, userCa.tls.certPem)).toMatch(/issued by "CN=other.example.net user CA, O=other.example.net", not by "CN=example.com user CA, O=example.com"/);
    expect(await verifyCert(pem, pem)).toMatch(/not a CA/);
  });

  it('refuses a forged certificate: same issuer name, another key', async () => {
    // A CA with the same name and cluster but a different key signs a certificate: the names match, the signature does not.
    const impostor = await generateAuthority('user', 'example.com');
    const pem = await issueTlsCert(impostor, { publicKeyPem: keys.publicKeyPem, identity: userIdentity('admin'), ttlMs: HOUR, usage: 'client' });
    const reason = await verifyCert(pem, userCa.tls.certPem);
    expect(reason).toBeDefined();
    expect(reason).toMatch(/not by|signature/);
  });

  it('gives reasons for garbage instead of throwing', async () => {
    expect(await verifyCert('nope', userCa.tls.certPem)).toMatch(/cannot be parsed/);
    expect(await verifyCert(userCa.tls.certPem, 'nope')).toMatch(/CA certificate .*cannot be parsed/);
  });
});

describe('CA pins', () => {
  it('equal sha256 of the SubjectPublicKeyInfo as openssl computes it', async () => {
    const path = file(hostCa.tls.certPem);
    const out = await sh(`openssl x509 -in ${path} -pubkey -noout | openssl pkey -pubin -outform der | sha256sum`);
    const hex = out.split(' ')[0];
    expect(caPin(hostCa.tls.certPem)).toBe(`sha256:${hex}`);
    expect(caPin(hostCa.tls.certPem)).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(caPin(userCa.tls.certPem)).not.toBe(caPin(hostCa.tls.certPem));
  });

  it('match the right pin in any case, not a wrong one, and refuse a malformed one', () => {
    const pin = caPin(hostCa.tls.certPem);
    expect(pinMatches(hostCa.tls.certPem, pin)).toBe(true);
    expect(pinMatches(hostCa.tls.certPem, pin.toUpperCase())).toBe(true);
    expect(pinMatches(hostCa.tls.certPem, `sha256:${pin.slice(7).toUpperCase()}`)).toBe(true);
    expect(pinMatches(hostCa.tls.certPem, caPin(userCa.tls.certPem))).toBe(false);
    const flipped = `${pin.slice(0, -1)}${pin.endsWith('0') ? '1' : '0'}`;
    expect(pinMatches(hostCa.tls.certPem, flipped)).toBe(false);
    // The same pin without its prefix, or pasted with blanks around it, is the same pin.
    for (const same of [pin.slice(7), pin.slice(7).toUpperCase(), ` ${pin}`, `${pin}\n`]) {
      expect(pinMatches(hostCa.tls.certPem, same), JSON.stringify(same)).toBe(true);
    }
    expect(pinMatches(hostCa.tls.certPem, flipped.slice(7))).toBe(false);
    for (const bad of [
      '',
      `sha1:${pin.slice(7)}`,
      pin.slice(0, -1),
      `${pin}0`,
      `${pin.slice(0, -1)}g`,
      'sha256:',
      `sha256:${pin.slice(7, 39)}`,
      `sha256:${pin}`,
      `${pin} ${pin}`,
    ]) {
      expect(codeOfSync(() => pinMatches(hostCa.tls.certPem, bad)), JSON.stringify(bad)).toBe('GW_ERR_AUTH_BAD_PIN');
    }
    const doubled = (() => {
      try {
        pinMatches(hostCa.tls.certPem, `sha256:${pin}`);
      } catch (err) {
        return err as GatewayError;
      }
    })();
    expect(doubled?.message).toContain('prefix twice');
    expect(doubled?.hint).toContain('--ca-pin=sha256:');
  });

  it('of a non-certificate is GW_ERR_AUTH_BAD_CERT', () => {
    expect(codeOfSync(() => caPin('garbage'))).toBe('GW_ERR_AUTH_BAD_CERT');
  });
});

describe('mutual TLS with Node', () => {
  async function serve(options: tls.TlsOptions): Promise<{
    server: tls.Server;
    port: number;
    identities: Identity[];
    /** Why the server dropped each client: its verify error (the emitted error is only "socket hang up"). */
    clientErrors: string[];
  }> {
    const identities: Identity[] = [];
    const clientErrors: string[] = [];
    const server = tls.createServer(options, (socket) => {
      identities.push(identityFromCert(socket.getPeerCertificate().raw));
      socket.end(`hello ${identities[identities.length - 1]?.name}\n`);
    });
    server.on('tlsClientError', (err, socket) => {
      clientErrors.push(socket.authorizationError?.toString() ?? (err as NodeJS.ErrnoException).code ?? err.message);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return { server, port: (server.address() as AddressInfo).port, identities, clientErrors };
  }

  function connect(port: number, options: tls.ConnectionOptions): Promise<{ data: string; error?: Error }> {
    return new Promise((resolve) => {
      let data = '';
      let error: Error | undefined;
      const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ...options });
      socket.setEncoding('utf8');
      socket.on('data', (d: string) => (data += d));
      socket.on('error', (err) => (error = err));
      socket.on('close', () => resolve(error ? { data, error } : { data }));
    });
  }

  let serverOptions: tls.TlsOptions;
  let proxyKeys: KeyPair;
  beforeAll(async () => {
    proxyKeys = generateKeyPair();
    const cert = await issueTlsCert(hostCa, {
      publicKeyPem: proxyKeys.publicKeyPem,
      identity: { kind: 'host', name: randomUUID(), cluster: 'example.com', roles: ['proxy'], nodename: 'proxy-1' },
      dnsNames: ['localhost'],
      ipAddresses: ['127.0.0.1'],
      ttlMs: HOUR,
      usage: 'server',
    });
    serverOptions = { key: proxyKeys.privateKeyPem, cert, ca: userCa.tls.certPem, requestCert: true, rejectUnauthorized: true };
  });

  it("complete a handshake, and the server reads the client's identity from the certificate", async () => {
    const s = await serve(serverOptions);
    try {
      const clientKeys = generateKeyPair();
      const identity = userIdentity('bob, the builder');
      const cert = await issueTlsCert(userCa, { publicKeyPem: clientKeys.publicKeyPem, identity, ttlMs: HOUR, usage: 'client' });
      const result = await connect(s.port, { ca: hostCa.tls.certPem, key: clientKeys.privateKeyPem, cert });
      expect(result.error).toBeUndefined();
      expect(result.data).toBe('hello bob, the builder\n');
      expect(s.identities).toEqual([identity]);
      // And by IP address (the IP SAN) rather than by name.
      const byIp = await connect(s.port, { ca: hostCa.tls.certPem, key: clientKeys.privateKeyPem, cert, servername: undefined });
      expect(byIp.error).toBeUndefined();
    } finally {
      s.server.close();
    }
  });

  it("refuse a client certificate from another cluster's CA in the handshake", async () => {
    const s = await serve(serverOptions);
    try {
      const clientKeys = generateKeyPair();
      const cert = await issueTlsCert(otherUserCa, {
        publicKeyPem: clientKeys.publicKeyPem, identity: { ...userIdentity(), cluster: 'other.example.net' }, ttlMs: HOUR, usage: 'client',
      });
      const result = await connect(s.port, { ca: hostCa.tls.certPem, key: clientKeys.privateKeyPem, cert });
      expect(result.data).toBe('');
      expect(s.identities).toEqual([]);
      expect(s.clientErrors).toEqual(['UNABLE_TO_VERIFY_LEAF_SIGNATURE']);
    } finally {
      s.server.close();
    }
  });

  it('refuse a client without a certificate, and a server-only certificate used as a client certificate', async () => {
    const s = await serve(serverOptions);
    try {
      const none = await connect(s.port, { ca: hostCa.tls.certPem });
      expect(none.data).toBe('');
      const clientKeys = generateKeyPair();
      const serverOnly = await issueTlsCert(userCa, { publicKeyPem: clientKeys.publicKeyPem, identity: userIdentity(), ttlMs: HOUR, usage: 'server' });
      const wrongUsage = await connect(s.port, { ca: hostCa.tls.certPem, key: clientKeys.privateKeyPem, cert: serverOnly });
      expect(wrongUsage.data).toBe('');
      expect(s.identities).toEqual([]);
      expect(s.clientErrors).toEqual(['ERR_SSL_PEER_DID_NOT_RETURN_A_CERTIFICATE', 'INVALID_PURPOSE']);
    } finally {
      s.server.close();
    }
  });

  it("refuse, on the client side, a server whose certificate comes from the user CA", async () => {
    const key = generateKeyPair();
    const cert = await issueTlsCert(userCa, {
      publicKeyPem: key.publicKeyPem, identity: hostIdentity(), dnsNames: ['localhost'], ttlMs: HOUR, usage: 'server',
    });
    const s = await serve({ key: key.privateKeyPem, cert });
    try {
      const result = await connect(s.port, { ca: hostCa.tls.certPem });
      expect((result.error as NodeJS.ErrnoException | undefined)?.code).toBe('UNABLE_TO_VERIFY_LEAF_SIGNATURE');
    } finally {
      s.server.close();
    }
  });
});

describe('SSH certificates', () => {
  const inUtc = (ms: number) => new Date(ms).toISOString().slice(0, 19);

  it('checkHostCert: a host certificate of that host, for that key, from that CA, valid then; otherwise why not', () => {
    const host = (over: Partial<Parameters<typeof issueSshCert>[1]> = {}, ca = hostCa) =>
      issueSshCert(ca, { publicKey: keys.sshPublicKey, certType: 'host', keyId: 'h-1', principals: ['h-1', 'web-1'], ttlMs: HOUR, clock: () => T0, ...over });
    const expected = { caKey: hostCa.ssh.publicKey, hostId: 'h-1', sshKey: keys.sshPublicKey, now: T0 };
    const refusal = (line: string, e = expected) => {
      const checked = checkHostCert(line, e);
      return 'refusal' in checked ? checked.refusal : undefined;
    };
    const ok = checkHostCert(host(), expected);
    expect('cert' in ok && ok.cert.keyId).toBe('h-1');
    expect(refusal(host({}, userCa))).toMatch(/not signed by the CA/);
    expect(refusal(host({ certType: 'user' }))).toMatch(/not a host certificate of h-1/);
    expect(refusal(host({ keyId: 'h-2' }))).toMatch(/not a host certificate of h-1/);
    expect(refusal(host({ principals: ['web-1'] }))).toMatch(/not a host certificate of h-1/);
    expect(refusal(host({ publicKey: generateKeyPair().sshPublicKey }))).toMatch(/certifies another key/);
    expect(refusal(host(), { ...expected, now: T0 + HOUR })).toMatch(/not valid now/);
    expect(refusal(host(), { ...expected, now: T0 - 2 * 60_000 })).toMatch(/not valid now/);
    expect(refusal('not a certificate')).toMatch(/cannot be read/);
  });

  it('user certificates are read by ssh-keygen -L: type, key id, principals, validity, default extensions', async () => {
    const line = issueSshCert(userCa, {
      publicKey: keys.sshPublicKey, certType: 'user', keyId: 'alice', principals: ['alice', 'root'], ttlMs: 12 * HOUR, clock: () => T0,
    });
    expect(line).toMatch(/^ecdsa-sha2-nistp256-cert-v01@openssh\.com AAAA[A-Za-z0-9+/]+=*$/);
    const out = await sh(`ssh-keygen -L -f ${file(`${line}\n`)}`, { TZ: 'UTC' });
    expect(out).toContain('Type: ecdsa-sha2-nistp256-cert-v01@openssh.com user certificate');
    expect(out).toContain('Key ID: "alice"');
    expect(out).toContain(`Valid: from ${inUtc(T0 - 60_000)} to ${inUtc(T0 + 12 * HOUR)}`);
    expect(out).toMatch(/Principals: \n\s+alice\n\s+root\n/);
    expect(out).toMatch(/Critical Options: \(none\)/);
    expect(out).toMatch(/Extensions: \n\s+permit-X11-forwarding\n\s+permit-agent-forwarding\n\s+permit-port-forwarding\n\s+permit-pty\n\s+permit-user-rc\n/);
    // The signing CA is the user CA's SSH key.
    const caFp = (await sh(`ssh-keygen -l -f ${file(`${userCa.ssh.publicKey}\n`)}`)).split(' ')[1];
    expect(out).toContain(`Signing CA: ECDSA ${caFp} (using ecdsa-sha2-nistp256)`);
  });

  it('host certificates are read by ssh-keygen -L with their principals and no extensions', async () => {
    const line = issueSshCert(hostCa, {
      publicKey: keys.sshPublicKey, certType: 'host', keyId: 'b7d2-host-id', principals: ['node-1', 'node-1.example.com', '10.0.0.5'], ttlMs: HOUR, clock: () => T0,
    });
    const out = await sh(`ssh-keygen -L -f ${file(`${line}\n`)}`, { TZ: 'UTC' });
    expect(out).toContain('Type: ecdsa-sha2-nistp256-cert-v01@openssh.com host certificate');
    expect(out).toContain('Key ID: "b7d2-host-id"');
    expect(out).toContain(`Valid: from ${inUtc(T0 - 60_000)} to ${inUtc(T0 + HOUR)}`);
    expect(out).toMatch(/Principals: \n\s+node-1\n\s+node-1\.example\.com\n\s+10\.0\.0\.5\n/);
    expect(out).toMatch(/Extensions: \(none\)/);
  });

  it('are read and verified by sshpk', () => {
    const user = issueSshCert(userCa, { publicKey: keys.sshPublicKey, certType: 'user', keyId: 'alice', principals: ['alice', 'root'], ttlMs: HOUR });
    const host = issueSshCert(hostCa, { publicKey: keys.sshPublicKey, certType: 'host', keyId: 'h', principals: ['node-1.example.com'], ttlMs: HOUR });
    const u = sshpk.parseCertificate(Buffer.from(user), 'openssh');
    expect(u.subjects.map((s) => s.uid)).toEqual(['alice', 'root']);
    expect(u.isSignedByKey(sshpk.parseKey(userCa.ssh.publicKey, 'ssh'))).toBe(true);
    expect(u.isSignedByKey(sshpk.parseKey(hostCa.ssh.publicKey, 'ssh'))).toBe(false);
    expect(u.isExpired(new Date())).toBe(false);
    expect(u.subjectKey.toString('ssh')).toBe(keys.sshPublicKey);
    const h = sshpk.parseCertificate(Buffer.from(host), 'openssh');
    expect(h.subjects.map((s) => s.hostname)).toEqual(['node-1.example.com']);
    expect(h.isSignedByKey(sshpk.parseKey(hostCa.ssh.publicKey, 'ssh'))).toBe(true);
  });

  it('parseSshCert round-trips every field and checks the signature', () => {
    const line = issueSshCert(userCa, {
      publicKey: keys.sshPublicKey, certType: 'user', keyId: 'alice@example.com', principals: ['alice', 'ubuntu'], ttlMs: 8 * HOUR, clock: () => T0,
      extensions: ['permit-pty', 'permit-agent-forwarding', 'permit-pty'],
    });
    const parsed = parseSshCert(line, userCa.ssh.publicKey);
    expect(parsed).toMatchObject({
      certType: 'user',
      keyId: 'alice@example.com',
      principals: ['alice', 'ubuntu'],
      validAfter: T0 - 60_000,
      validBefore: T0 + 8 * HOUR,
      signedByCa: true,
      extensions: ['permit-agent-forwarding', 'permit-pty'], // sorted and unique, as OpenSSH requires
      criticalOptions: {},
      publicKey: keys.sshPublicKey,
      signatureKey: userCa.ssh.publicKey,
    });
    expect(parsed.serial).toMatch(/^\d+$/);
    expect(parseSshCert(`${line} alice@laptop`, userCa.ssh.publicKey).signedByCa).toBe(true); // a comment is fine
    expect(parseSshCert(line).signedByCa).toBeUndefined();
    const defaults = parseSshCert(issueSshCert(userCa, { publicKey: keys.sshPublicKey, certType: 'user', keyId: 'a', principals: ['a'], ttlMs: HOUR }));
    expect([...defaults.extensions].sort()).toEqual([...DEFAULT_USER_EXTENSIONS].sort());
  });

  it('parseSshCert detects a certificate signed by another CA, and a tampered one (so does ssh-keygen)', async () => {
    const line = issueSshCert(otherUserCa, { publicKey: keys.sshPublicKey, certType: 'user', keyId: 'mallory', principals: ['root'], ttlMs: HOUR });
    expect(parseSshCert(line, userCa.ssh.publicKey).signedByCa).toBe(false);
    expect(parseSshCert(line, otherUserCa.ssh.publicKey).signedByCa).toBe(true);

    // Same signature key, altered content: change the key id "alice" to "admin" inside the signed blob.
    const good = issueSshCert(userCa, { publicKey: keys.sshPublicKey, certType: 'user', keyId: 'alice', principals: ['alice'], ttlMs: HOUR });
    const [type, b64] = good.split(' ') as [string, string];
    const blob = Buffer.from(b64, 'base64');
    const at = blob.indexOf('alice');
    blob.write('admin', at);
    const tampered = `${type} ${blob.toString('base64')}`;
    const parsed = parseSshCert(tampered, userCa.ssh.publicKey);
    expect(parsed.keyId).toBe('admin');
    expect(parsed.signedByCa).toBe(false);
    await expect(sh(`ssh-keygen -L -f ${file(`${tampered}\n`)}`)).rejects.toThrow();
    await expect(sh(`ssh-keygen -L -f ${file(`${good}\n`)}`)).resolves.toContain('Key ID: "alice"');
  });

  it('certifies Ed25519 and RSA keys too (made by ssh-keygen)', async () => {
    for (const [t, bits] of [['ed25519', ''], ['rsa', '-b 2048']] as const) {
      const path = join(dir, `id_${t}`);
      await sh(`ssh-keygen -q -t ${t} ${bits} -N '' -C test -f ${path}`);
      const pub = readFileSync(`${path}.pub`, 'utf8').trim();
      const line = issueSshCert(userCa, { publicKey: pub, certType: 'user', keyId: t, principals: ['alice'], ttlMs: HOUR });
      expect(line.startsWith(`${pub.split(' ')[0]}-cert-v01@openssh.com `)).toBe(true);
      const out = await sh(`ssh-keygen -L -f ${file(`${line}\n`)}`);
      expect(out).toContain(`Key ID: "${t}"`);
      const parsed = parseSshCert(line, userCa.ssh.publicKey);
      expect(parsed.signedByCa).toBe(true);
      expect(parsed.publicKey).toBe(pub.split(' ').slice(0, 2).join(' '));
    }
    // And a PEM public key works as the subject key.
    const ed = generateKeyPairSync('ed25519');
    const pem = ed.publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const line = issueSshCert(hostCa, { publicKey: pem, certType: 'host', keyId: 'h', principals: ['h'], ttlMs: HOUR });
    expect(parseSshCert(line, hostCa.ssh.publicKey).publicKey).toBe(sshPublicKeyFromPem(pem));
  });

  it('refuse bad requests', () => {
    const base = { publicKey: keys.sshPublicKey, certType: 'user' as const, keyId: 'alice', principals: ['alice'], ttlMs: HOUR };
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, principals: [] }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, principals: [''] }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, keyId: '' }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, ttlMs: -1 }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, certType: 'robot' as 'user' }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, extensions: ['bad name'] }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(hostCa, { ...base, certType: 'host', extensions: ['permit-pty'] }))).toBe('GW_ERR_PKI_BAD_REQUEST');
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, publicKey: 'ssh-ed25519 AAAA' }))).toBe('GW_ERR_PKI_BAD_KEY');
    const cert = issueSshCert(userCa, base);
    expect(codeOfSync(() => issueSshCert(userCa, { ...base, publicKey: cert }))).toBe('GW_ERR_PKI_BAD_KEY');
  });

  it('parseSshCert refuses garbled lines with GW_ERR_AUTH_BAD_CERT, a garbled CA key with GW_ERR_PKI_BAD_KEY', () => {
    const line = issueSshCert(userCa, { publicKey: keys.sshPublicKey, certType: 'user', keyId: 'a', principals: ['a'], ttlMs: HOUR });
    const [type, b64] = line.split(' ') as [string, string];
    const blob = Buffer.from(b64, 'base64');
    for (const bad of [
      '',
      'garbage',
      keys.sshPublicKey, // a key, not a certificate
      `${type} ${blob.subarray(0, blob.length - 10).toString('base64')}`, // truncated
      `${type} ${Buffer.concat([blob, Buffer.from([0])]).toString('base64')}`, // trailing bytes
      `ssh-ed25519-cert-v01@openssh.com ${b64}`, // type does not match the blob
    ]) {
      expect(codeOfSync(() => parseSshCert(bad)), bad.slice(0, 40)).toBe('GW_ERR_AUTH_BAD_CERT');
    }
    expect(codeOfSync(() => parseSshCert(line, 'not a key'))).toBe('GW_ERR_PKI_BAD_KEY');
  });
});

describe('fsutil', () => {
  it('writeSecretFile: mode 0600, parent created 0700, atomic replace, no temp files left', () => {
    const base = mkdtempSync(join(tmpdir(), 'gw-fs-'));
    try {
      const path = join(base, 'a', 'b', 'key.pem');
      writeSecretFile(path, keys.privateKeyPem);
      expect(statSync(path).mode & 0o777).toBe(0o600);
      expect(statSync(join(base, 'a', 'b')).mode & 0o777).toBe(0o700);
      expect(statSync(join(base, 'a')).mode & 0o777).toBe(0o700);
      expect(readFileSync(path, 'utf8')).toBe(keys.privateKeyPem);
      chmodSync(path, 0o644); // even over a file someone loosened, the new one is 0600
      writeSecretFile(path, Buffer.from('second'));
      expect(readFileSync(path, 'utf8')).toBe('second');
      expect(statSync(path).mode & 0o777).toBe(0o600);
      expect(readdirSync(join(base, 'a', 'b'))).toEqual(['key.pem']);
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });

  it('writePublicFile: mode 0644 by default or as given; readIfExists', () => {
    const base = mkdtempSync(join(tmpdir(), 'gw-fs-'));
    const oldUmask = process.umask(0o077);
    try {
      const path = join(base, 'ca.pem');
      writePublicFile(path, hostCa.tls.certPem);
      expect(statSync(path).mode & 0o777).toBe(0o644); // despite the umask
      writePublicFile(join(base, 'x'), 'x', 0o640);
      expect(statSync(join(base, 'x')).mode & 0o777).toBe(0o640);
      expect(readIfExists(path)).toBe(hostCa.tls.certPem);
      expect(readIfExists(join(base, 'missing'))).toBeUndefined();
      expect(readdirSync(base).sort()).toEqual(['ca.pem', 'x']);
    } finally {
      process.umask(oldUmask);
      rmSync(base, { recursive: true, force: true });
    }
  });

  it('fails with GW_ERR_FS_WRITE / GW_ERR_FS_READ naming the path, never the data, and cleans up', () => {
    const base = mkdtempSync(join(tmpdir(), 'gw-fs-'));
    try {
      writePublicFile(join(base, 'file'), 'x');
      let err: unknown;
      try {
        writeSecretFile(join(base, 'file', 'key.pem'), keys.privateKeyPem); // parent is a file
      } catch (e) {
        err = e;
      }
      expect(isGatewayError(err, 'GW_ERR_FS_WRITE')).toBe(true);
      expect((err as Error).message).toContain(join(base, 'file', 'key.pem'));
      expect((err as Error).message).not.toContain('PRIVATE KEY');

      const dirAsTarget = join(base, 'adir');
      writeSecretFile(join(dirAsTarget, 'inner'), 'x');
      expect(codeOfSync(() => writeSecretFile(dirAsTarget, keys.privateKeyPem))).toBe('GW_ERR_FS_WRITE'); // rename onto a directory
      expect(readdirSync(base).sort()).toEqual(['adir', 'file']); // no temp file left behind
      expect(codeOfSync(() => readIfExists(dirAsTarget))).toBe('GW_ERR_FS_READ');
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});
