/**
 * The names the web port's certificate carries (src/roles/names.ts webServerNames), where they decide whether a
 * client's TLS name check passes: the Kubernetes route's server name that gwsh kube login gives kubectl.
 */
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { webServerNames } from '../../src/roles/names.js';
import { KUBE_LOCAL_SNI } from '../../src/wire/protocols.js';

const names = (publicAddr: string) => webServerNames(parseConfig(['proxy_service:', `  public_addr: ${publicAddr}`, ''].join('\n'), 'names.test.yaml'));

describe('webServerNames', () => {
  it('a Proxy reached by IP address carries the Kubernetes route name that needs no host (gwsh kube login\'s tls-server-name)', () => {
    expect(names('203.0.113.7:443')).toContain(KUBE_LOCAL_SNI);
  });

  it('a Proxy reached by name carries *.<name> (kube-gateway-proxy-alpn.<name> under it), and not the IP one', () => {
    const got = names('gateway.example.com:443');
    expect(got).toContain('*.gateway.example.com');
    expect(got).not.toContain(KUBE_LOCAL_SNI);
  });
});
