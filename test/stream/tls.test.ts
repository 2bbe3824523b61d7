import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { connectTls } from '../../src/stream/tls.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

let pki: TestPki;
let server: tls.Server;
let port: number;
const sniSeen: Array<string | false> = [];

beforeAll(async () => {
  pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
  server = tls.createServer({ cert: cert.certPem, key: cert.keyPem, ALPNProtocols: ['gateway-test'] }, (s) => {
    sniSeen.push((s as tls.TLSSocket & { servername: string | false }).servername);
    s.end();
  });
  server.on('tlsClientError', () => undefined);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as net.AddressInfo).port;
});

afterAll(async () => {
  server.close();
  await pki.cleanup();
});

const dial = () => net.connect(port, '127.0.0.1');

describe('connectTls', () => {
  it('resolves once the handshake is done, with the ALPN negotiated', async () => {
    const socket = await connectTls(dial(), { host: 'localhost', ca: pki.caPem, ALPNProtocols: ['gateway-test'] });
    expect(socket.alpnProtocol).toBe('gateway-test');
    expect(socket.authorized).toBe(true);
    socket.destroy();
  });

  it('sends the host as SNI for a name, none for an IP address, and a given servername over both', async () => {
    sniSeen.length = 0;
    for (const options of [{ host: 'localhost' }, { host: '127.0.0.1' }, { host: '127.0.0.1', servername: 'localhost' }]) {
      const socket = await connectTls(dial(), { ...options, ca: pki.caPem });
      await new Promise((r) => socket.once('close', r).resume());
    }
    expect(sniSeen).toEqual(['localhost', false, 'localhost']);
  });

  it('rejects with the TLS error as it came, for the caller to classify', async () => {
    const other = await makeTestPki();
    const err = await connectTls(dial(), { host: 'localhost', ca: other.caPem }).then(
      () => undefined,
      (e: unknown) => e,
    );
    await other.cleanup();
    expect(isGatewayError(err)).toBe(false);
    expect((err as NodeJS.ErrnoException).code).toMatch(/UNABLE_TO_VERIFY_LEAF_SIGNATURE|SELF_SIGNED|UNABLE_TO_GET_ISSUER/);
  });
});
