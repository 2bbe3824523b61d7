// lintian overrides shipped in the .deb packages (/usr/share/lintian/overrides/<name>). Each tag lintian still
// reports on the built packages is here with the reason it stays (docs/install.md, "lintian", lists them too);
// test/package/build.test.ts fails when lintian reports anything else.
const COMMON = [
  '# The units are neither enabled nor started by the package (docs/install.md); the scripts only reload systemd,',
  '# and try-restart / stop a unit on upgrade / removal, guarded for a system without systemd and for DPKG_ROOT',
  '# installs. deb-systemd-invoke would not run them in another root either.',
  'maintainer-script-calls-systemctl',
];

const SERVER = [
  ...COMMON,
  '# The package carries the Node.js runtime of the build machine (the distributions\' Node.js is older than the',
  '# gateway needs). It is built upstream: its own zlib, OpenSSL, ICU, no PIE; it needs only libc and libstdc++',
  '# (and libgcc_s), which every system that installs with apt has (apt itself depends on them): no Depends, so',
  '# the package also installs into an empty root (the tests).',
  'embedded-library zlib [usr/lib/gateway/node]',
  'hardening-no-pie [usr/lib/gateway/node]',
  'undeclared-elf-prerequisites *',
  '# JavaScript files with "#!/usr/bin/env node": the wrappers in /usr/bin run the app with the bundled runtime,',
  '# and the packages\' own command-line scripts in node_modules are never run.',
  'missing-dep-for-interpreter node (does not satisfy nodejs:any) *',
  '# node_modules is the app\'s own, exactly the versions package-lock.json names: not the Debian packages\'.',
  'embedded-javascript-library *',
];

export const LINTIAN_OVERRIDES = {
  server: `${SERVER.join('\n')}\n`,
  updater: [
    ...COMMON,
    '',
  ].join('\n'),
};
