import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Suites start real squid / daemons; the machine has 2 cores.
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // As a normal user, the last line says how many suites were skipped because they need root (test/helpers/root.ts).
    reporters: ['default', './test/helpers/root-reporter.ts'],
  },
});
