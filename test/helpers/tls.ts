/**
 * A throwaway PKI for tests, made with the `openssl` CLI: one CA and any
 * number of server and client certificates signed by it (ECDSA P-256, valid 2 days).
 *
 * Used for the https:// proxy (squid `https_port`) and for TLS servers in
 * tests; clients trust `caPem` (e.g. `tls.connect({ ca: pki.caPem })`).
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface ServerCert {
  certPath: string;
  keyPath: string;
  certPem: string;
  keyPem: string;
}

export interface TestPki {
  /** Directory holding every file (created with mkdtemp unless given). */
  dir: string;
  /** CA certificate, PEM text. Same as `caPem`. */
  caCert: string;
  /** CA private key, PEM text (PKCS#8). */
  caKey: string;
  caCertPath: string;
  caKeyPath: string;
  caPem: string;
  /**
   * Issues a server certificate (CN = first name or IP) with the given
   * subjectAltName DNS and IP entries and the serverAuth extended key usage.
   */
  serverCert(opts: { names: string[]; ips: string[] }): Promise<ServerCert>;
  /**
   * Issues a client certificate (CN = cn, clientAuth extended key usage), e.g. for a database user; each of
   * `organizations` becomes an O (a Kubernetes API server reads them as the user's groups).
   */
  clientCert(opts: { cn: string; organizations?: string[] }): Promise<ServerCert>;
  /** Removes `dir`. */
  cleanup(): Promise<void>;
}

/** Minimal openssl config: distinguished name from -subj, extensions by section. */
const OPENSSL_CNF = `[req]
distinguished_name = dn
prompt = no
[dn]
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
`;

async function newKey(path: string): Promise<void> {
  await run('openssl', ['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', path]);
}

/** Creates the CA in `dir` (default: a fresh temp dir); `subject` is its name in openssl's form (/CN=.../O=...). */
export async function makeTestPki(dir?: string, options: { subject?: string } = {}): Promise<TestPki> {
  const root = dir ?? (await mkdtemp(join(tmpdir(), 'gw-pki-')));
  const cnf = join(root, 'openssl.cnf');
  const caKeyPath = join(root, 'ca.key');
  const caCertPath = join(root, 'ca.crt');
  await writeFile(cnf, OPENSSL_CNF);
  await newKey(caKeyPath);
  await run('openssl', [
    'req', '-x509', '-new', '-config', cnf, '-extensions', 'ca_ext', '-key', caKeyPath,
    '-subj', options.subject ?? '/CN=Gateway Test CA', '-days', '2', '-sha256', '-out', caCertPath,
  ]);
  const caPem = await readFile(caCertPath, 'utf8');
  const caKey = await readFile(caKeyPath, 'utf8');
  let issued = 0;

  /** A key and a certificate signed by the CA, with the given extensions. */
  async function issue(kind: string, cn: string, extensions: string, organizations: string[] = []): Promise<ServerCert> {
    const base = join(root, `${kind}-${++issued}`);
    const [keyPath, csrPath, certPath, extPath] = ['.key', '.csr', '.crt', '.ext'].map((s) => base + s) as [string, string, string, string];
    await writeFile(extPath, extensions);
    await newKey(keyPath);
    await run('openssl', ['req', '-new', '-config', cnf, '-key', keyPath, '-subj', `/CN=${cn}${organizations.map((o) => `/O=${o}`).join('')}`, '-out', csrPath]);
    await run('openssl', [
      'x509', '-req', '-in', csrPath, '-CA', caCertPath, '-CAkey', caKeyPath,
      '-set_serial', `0x${randomBytes(8).toString('hex')}`, '-days', '2', '-sha256',
      '-extfile', extPath, '-out', certPath,
    ]);
    return { certPath, keyPath, certPem: await readFile(certPath, 'utf8'), keyPem: await readFile(keyPath, 'utf8') };
  }

  async function serverCert(opts: { names: string[]; ips: string[] }): Promise<ServerCert> {
    const cn = opts.names[0] ?? opts.ips[0];
    if (cn === undefined) throw new Error('serverCert: need at least one name or IP');
    for (const ip of opts.ips) if (!isIP(ip)) throw new Error(`serverCert: not an IP: ${ip}`);
    const san = [...opts.names.map((n) => `DNS:${n}`), ...opts.ips.map((ip) => `IP:${ip}`)].join(',');
    return issue(
      'server',
      cn,
      'basicConstraints = critical,CA:FALSE\n' +
        'keyUsage = critical,digitalSignature,keyEncipherment\n' +
        'extendedKeyUsage = serverAuth\n' +
        `subjectAltName = ${san}\n` +
        'subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid,issuer\n',
    );
  }

  async function clientCert(opts: { cn: string; organizations?: string[] }): Promise<ServerCert> {
    return issue(
      'client',
      opts.cn,
      'basicConstraints = critical,CA:FALSE\n' +
        'keyUsage = critical,digitalSignature,keyEncipherment\n' +
        'extendedKeyUsage = clientAuth\n' +
        'subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid,issuer\n',
      opts.organizations,
    );
  }

  return {
    dir: root,
    caCert: caPem,
    caKey,
    caCertPath,
    caKeyPath,
    caPem,
    serverCert,
    clientCert,
    cleanup: () => rm(root, { recursive: true, force: true }),
  };
}
