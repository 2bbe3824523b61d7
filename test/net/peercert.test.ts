/**
 * peerX509 (src/net/tls.ts): the peer's certificate, asked for as often as a caller likes, on both ends of a real
 * TLS 1.3 connection with client certificates. Node 20's own getPeerX509Certificate() answers once on a client
 * socket (the certificate is gone after it), which is why every caller goes through peerX509; the last test keeps
 * the code from calling it again.
 */
import { once } from 'node:events';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import tls, { type TLSSocket } from 'node:tls';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert } from '../../src/auth/pki.js';
import { peerX509 } from '../../src/net/tls.js';

const CLUSTER = 'peercert.test';
let server: tls.Server;
let client: TLSSocket;
let accepted: TLSSocket;
let serverPem: string;
let clientPem: string;

beforeAll(async () => {
  const ca = await generateAuthority('host', CLUSTER);
  const serverKeys = generateKeyPair();
  const clientKeys = generateKeyPair();
  serverPem = await issueTlsCert(ca, { identity: { kind: 'host', name: 'server', cluster: CLUSTER, roles: ['proxy'] }, publicKeyPem: serverKeys.publicKeyPem, usage: 'server', ttlMs: 3600_000, dnsNames: ['localhost'] });
  clientPem = await issueTlsCert(ca, { identity: { kind: 'host', name: 'client', cluster: CLUSTER, roles: ['node'] }, publicKeyPem: clientKeys.publicKeyPem, usage: 'client', ttlMs: 3600_000 });
  server = tls.createServer({ key: serverKeys.privateKeyPem, cert: serverPem, ca: ca.tls.certPem, requestCert: true, rejectUnauthorized: true, minVersion: 'TLSv1.3' });
  const got = once(server, 'secureConnection') as Promise<[TLSSocket]>;
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  client = tls.connect({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', servername: 'localhost', ca: ca.tls.certPem, key: clientKeys.privateKeyPem, cert: clientPem });
  await once(client, 'secureConnect');
  [accepted] = await got;
});

afterAll(() => {
  client?.destroy();
  server?.close();
});

describe('peerX509', () => {
  it("gives the client the server's certificate every time it is asked, and leaves it to getPeerCertificate", () => {
    const first = peerX509(client);
    const second = peerX509(client);
    expect(first?.raw.equals(Buffer.from(serverPem.replace(/-----[^-]+-----|\s/g, ''), 'base64'))).toBe(true);
    expect(second?.fingerprint256).toBe(first?.fingerprint256);
    expect(client.getPeerCertificate().raw?.length).toBeGreaterThan(0);
  });

  it("gives the server the client's certificate every time it is asked", () => {
    expect(peerX509(accepted)?.fingerprint256).toBe(peerX509(accepted)?.fingerprint256);
    expect(peerX509(accepted)?.raw.equals(Buffer.from(clientPem.replace(/-----[^-]+-----|\s/g, ''), 'base64'))).toBe(true);
  });

  it('is undefined for a peer without a certificate (a server that asked for none)', async () => {
    const keys = generateKeyPair();
    const ca = await generateAuthority('host', CLUSTER);
    const cert = await issueTlsCert(ca, { identity: { kind: 'host', name: 'anon', cluster: CLUSTER, roles: ['proxy'] }, publicKeyPem: keys.publicKeyPem, usage: 'server', ttlMs: 3600_000, dnsNames: ['localhost'] });
    const plain = tls.createServer({ key: keys.privateKeyPem, cert });
    const got = once(plain, 'secureConnection') as Promise<[TLSSocket]>;
    plain.listen(0, '127.0.0.1');
    await once(plain, 'listening');
    const c = tls.connect({ port: (plain.address() as AddressInfo).port, host: '127.0.0.1', servername: 'localhost', ca: ca.tls.certPem });
    await once(c, 'secureConnect');
    const [s] = await got;
    expect(peerX509(s)).toBeUndefined();
    c.destroy();
    plain.close();
  });

  it('no code of the gateway calls getPeerX509Certificate itself', () => {
    const root = fileURLToPath(new URL('../../src', import.meta.url));
    const offenders: string[] = [];
    const walk = (dir: string): void => {
      for (const name of readdirSync(dir)) {
        const path = join(dir, name);
        if (statSync(path).isDirectory()) walk(path);
        else if (path.endsWith('.ts') && !path.endsWith(join('net', 'tls.ts')) && /\.getPeerX509Certificate\(/.test(readFileSync(path, 'utf8'))) offenders.push(path);
      }
    };
    walk(root);
    expect(offenders).toEqual([]);
  });
});
