/**
 * src/internals.ts, the one file that reads private fields of other libraries, both halves of each field:
 *   - the libraries installed still have it (real objects: a TLS socket, an ssh2 connection, a node-pty terminal,
 *     ssh2's SFTP server answering INIT; an ssh2 channel's state in test/stream/reset.test.ts, v1): an upgrade that
 *     drops a field fails here, not in production;
 *   - an object without the field gets the fallback (undefined, logged once per field, or GW_ERR_SFTP_UNAVAILABLE),
 *     and the callers' fallbacks that are decided outside src/internals.ts: a hand-made TLS socket whose verdict
 *     cannot be read is not verified. (SshEndpoint's: test/net/ssh-fallback.test.ts.)
 */
import { EventEmitter } from 'node:events';
import net from 'node:net';
import { Duplex, Writable } from 'node:stream';
import tls from 'node:tls';
import ssh2 from 'ssh2';
import type { Connection } from 'ssh2';
import { afterAll, describe, expect, it } from 'vitest';
import { generateKeyPair, sshPrivateKeyPem } from '../src/auth/pki.js';
import { isGatewayError } from '../src/errors.js';
import { ptyMaster, sftpServer, sshChannelClosed, sshConnectionStream, tlsSocketParent, tlsVerifyResult, type SftpChannelState } from '../src/internals.js';
import { createLogger, setRootLogger } from '../src/log.js';
import { recordClientVerification, serverSecureContext, terminateTls, VERDICT_UNAVAILABLE } from '../src/net/tls.js';
import { makeTestPki } from './helpers/tls.js';

const logged: Array<{ field?: string }> = [];
setRootLogger(
  createLogger({
    level: 'error',
    destination: new Writable({
      write(chunk: Buffer, _e, cb) {
        for (const line of chunk.toString().split('\n').filter(Boolean)) logged.push(JSON.parse(line) as { field?: string });
        cb();
      },
    }),
  }),
);

const cleanups: Array<() => unknown> = [];
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const sink = (): Duplex => new Duplex({ read() {}, write: (_c, _e, cb) => cb() });
const asTls = (o: object) => o as unknown as tls.TLSSocket;

describe('without the field (after a library upgrade)', () => {
  it('each accessor gives its fallback, and logs once per field', () => {
    for (let i = 0; i < 2; i++) {
      expect(tlsSocketParent(asTls({}))).toBeUndefined();
      expect(tlsVerifyResult(asTls({ _handle: {} }))).toBeUndefined();
      expect(sshConnectionStream(new EventEmitter() as unknown as Connection)).toBeUndefined();
      expect(ptyMaster({ fd: 5 })).toBeUndefined();
      expect(ptyMaster({ fd: 5, _socket: {} })).toBeUndefined();
      expect(sshChannelClosed({ incoming: {} })).toBeUndefined();
    }
    expect(logged.map((l) => l.field).sort()).toEqual([
      'TLSSocket._handle.verifyError',
      'TLSSocket._parent',
      'node-pty Terminal._socket',
      'ssh2 Channel.incoming.state',
      'ssh2 Connection._sock',
    ]);
  });

  it('a field of another shape is not used', () => {
    expect(tlsSocketParent(asTls({ _parent: 'a string' }))).toBeUndefined();
    expect(sshConnectionStream({ _sock: { on() {} } } as unknown as Connection)).toBeUndefined();
    expect(ptyMaster({ fd: '5', _socket: { destroyed: false } })).toBeUndefined();
    expect(ptyMaster(null)).toBeUndefined();
  });

  it('a hand-made TLS socket whose verdict cannot be read is not verified, even with a certificate', () => {
    const socket = asTls({ authorized: false, getPeerCertificate: () => ({ raw: Buffer.from('a certificate') }) });
    recordClientVerification(socket);
    expect(socket.authorized).toBe(false);
    expect(String(socket.authorizationError)).toBe(VERDICT_UNAVAILABLE);
  });

  it('with the verdict, as tls.Server records it', () => {
    const ok = asTls({ authorized: false, _handle: { verifyError: () => null }, getPeerCertificate: () => ({ raw: Buffer.from('c') }) });
    recordClientVerification(ok);
    expect(ok.authorized).toBe(true);
    const bad = asTls({ authorized: false, _handle: { verifyError: () => Object.assign(new Error('x'), { code: 'CERT_HAS_EXPIRED' }) }, getPeerCertificate: () => ({ raw: Buffer.from('c') }) });
    recordClientVerification(bad);
    expect([bad.authorized, String(bad.authorizationError)]).toEqual([false, 'CERT_HAS_EXPIRED']);
  });

  it("ssh2's SFTP class missing or not loadable: GW_ERR_SFTP_UNAVAILABLE", () => {
    const output = { data() {}, close() {} };
    const state: SftpChannelState = { id: 0, state: 'open', window: Infinity, packetSize: Infinity };
    for (const load of [() => ({}), () => undefined, () => { throw new Error("Cannot find module 'ssh2/lib/protocol/SFTP.js'"); }]) {
      let code = 'no error';
      try {
        sftpServer(output, state, load);
      } catch (err) {
        code = isGatewayError(err) ? err.code : String(err);
      }
      expect(code).toBe('GW_ERR_SFTP_UNAVAILABLE');
    }
  });
});

describe('the installed libraries still have each field', () => {
  it("Node: a TLSSocket's net.Socket, or the stream Node's JSStreamSocket wraps (a connection upgrade's), and OpenSSL's verdict", async () => {
    const raw = new net.Socket();
    const onSocket = new tls.TLSSocket(raw);
    const duplex = sink();
    const onDuplex = new tls.TLSSocket(duplex, { isServer: true });
    cleanups.push(() => onSocket.destroy(), () => onDuplex.destroy());
    const before = logged.length;
    expect(tlsSocketParent(onSocket)).toBe(raw);
    expect(tlsSocketParent(onDuplex)).toBe(duplex);
    expect(logged.length).toBe(before);

    // The verdict exists once a handshake ran (reading it before one crashes Node): terminateTls records it.
    const pki = await makeTestPki();
    cleanups.push(() => pki.cleanup());
    const server = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
    const trusted = await pki.clientCert({ cn: 'alice' });
    const other = await makeTestPki();
    cleanups.push(() => other.cleanup());
    const untrusted = await other.clientCert({ cn: 'mallory' });
    const context = serverSecureContext({ key: server.keyPem, cert: server.certPem, ca: pki.caPem }, 'internals-test');
    const tcp = net.createServer((socket) => terminateTls(socket, { secureContext: context, alpn: [], handshakeMs: 30_000 }, (s) => secured.push(s)));
    const secured: tls.TLSSocket[] = [];
    await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => tcp.close(resolve)));
    const port = (tcp.address() as net.AddressInfo).port;
    for (const cert of [trusted, untrusted]) {
      const c = tls.connect({ port, host: '127.0.0.1', ca: pki.caPem, key: cert.keyPem, cert: cert.certPem, servername: 'localhost' });
      c.on('error', () => undefined);
      cleanups.push(() => c.destroy());
      await new Promise((resolve) => c.once('secureConnect', resolve));
    }
    await expect.poll(() => secured.length).toBe(2);
    expect(secured[0]!.authorized).toBe(true);
    expect([secured[1]!.authorized, String(secured[1]!.authorizationError)]).toEqual([false, 'UNABLE_TO_VERIFY_LEAF_SIGNATURE']);
    expect(logged.length).toBe(before);
  });

  it('ssh2: a server Connection runs on the stream handed to injectSocket', async () => {
    const conns: Connection[] = [];
    const server = new ssh2.Server({ hostKeys: [sshPrivateKeyPem(generateKeyPair().privateKeyPem)] }, (conn) => {
      conn.on('error', () => undefined);
      conns.push(conn);
    });
    const tcp = net.createServer((socket) => server.injectSocket(socket));
    await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => tcp.close(resolve)));
    const accepted = new Promise<net.Socket>((resolve) => tcp.once('connection', resolve));
    const client = net.connect((tcp.address() as net.AddressInfo).port, '127.0.0.1');
    client.on('error', () => undefined);
    cleanups.push(() => client.destroy());
    client.write('SSH-2.0-test\r\n');
    const socket = await accepted;
    await expect.poll(() => conns.length).toBe(1);
    expect(sshConnectionStream(conns[0]!)).toBe(socket);
  });

  it("node-pty: a terminal's master descriptor, open until the terminal is destroyed", async () => {
    const { spawn } = await import('node-pty');
    const term = spawn('/bin/sh', ['-c', 'sleep 30'], { cols: 80, rows: 24 });
    cleanups.push(() => term.kill());
    const master = ptyMaster(term);
    expect(master?.fd).toEqual(expect.any(Number));
    expect(master!.isOpen()).toBe(true);
    (term as unknown as { destroy(): void }).destroy(); // UnixTerminal's, not in IPty's type
    expect(master!.isOpen()).toBe(false);
  });

  it("ssh2's SFTP server answers INIT with VERSION 3 through the callbacks", () => {
    const out: Buffer[] = [];
    const sftp = sftpServer({ data: (b) => out.push(Buffer.from(b)), close() {} }, { id: 0, state: 'open', window: Infinity, packetSize: Infinity });
    sftp.push(Buffer.from([0, 0, 0, 5, 1, 0, 0, 0, 3])); // length 5, SSH_FXP_INIT, version 3
    const reply = Buffer.concat(out);
    expect(reply[4]).toBe(2); // SSH_FXP_VERSION
    expect(reply.readUInt32BE(5)).toBe(3);
  });
});
