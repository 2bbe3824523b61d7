/** The ready configurations of docs/high-availability.md are valid and mean what the page says. */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { enabledServices, parseConfig } from '../../src/config/index.js';

const page = readFileSync(new URL('../../docs/high-availability.md', import.meta.url), 'utf8');
const yamlBlocks = [...page.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]!);

describe('docs/high-availability.md', () => {
  it('has the Auth Service and the Proxy configurations', () => {
    expect(yamlBlocks).toHaveLength(2);
  });

  it('the Auth Service: PostgreSQL storage, no Proxy, agent_mesh', () => {
    const config = parseConfig(yamlBlocks[0]!, 'auth.yaml');
    expect(enabledServices(config)).toEqual(['auth_service']);
    expect(config.gateway.storage.type).toBe('postgres');
    expect(config.auth_service.tunnel_strategy.type).toBe('agent_mesh');
  });

  it('the Proxy: no Auth Service in its process, both Auth addresses, the balancer as public address, PROXY headers on', () => {
    const config = parseConfig(yamlBlocks[1]!, 'proxy.yaml');
    expect(enabledServices(config)).toEqual(['proxy_service']);
    expect(config.gateway.auth_server.map((a) => `${a.host}:${a.port}`)).toEqual(['auth-a.internal:3025', 'auth-b.internal:3025']);
    expect(config.proxy_service.public_addr.map((a) => `${a.host}:${a.port}`)).toEqual(['proxy.example.com:443']);
    expect(config.proxy_service.proxy_protocol).toBe('on');
    expect(config.proxy_service.proxy_protocol_trusted_sources).toEqual(['10.0.0.10']);
    expect(config.proxy_service.peer_listen_addr.port).toBe(3021);
  });
});
