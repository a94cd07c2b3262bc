// Compiles settlement/contracts/*.sol with the pinned solc-js into
// settlement/contracts/out/<Contract>.json ({abi, bytecode}); with --check, fails when
// the committed files differ from a fresh compile (the settlement crate embeds them).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(path.join(process.cwd(), "node_modules", "x.js"));
const solc = require("solc");
const here = path.dirname(new URL(import.meta.url).pathname);
const contracts = path.join(here, "..", "contracts");
const out = path.join(contracts, "out");
const check = process.argv.includes("--check");

const sources = {};
for (const file of fs.readdirSync(contracts).filter((f) => f.endsWith(".sol")).sort()) {
  sources[file] = { content: fs.readFileSync(path.join(contracts, file), "utf8") };
}
const input = {
  language: "Solidity",
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: "cancun",
    metadata: { bytecodeHash: "none" },
    outputSelection: {
      "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "evm.deployedBytecode.immutableReferences"] },
    },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === "error");
for (const e of output.errors || []) console.error(e.formattedMessage);
if (errors.length) process.exit(1);

let stale = [];
fs.mkdirSync(out, { recursive: true });
for (const [file, byName] of Object.entries(output.contracts)) {
  for (const [name, compiled] of Object.entries(byName)) {
    if (!compiled.evm.bytecode.object) continue; // interfaces
    // The deployed code with where its immutables go, so a client can tell this
    // contract from any other at an address (immutables masked).
    const immutables = Object.values(compiled.evm.deployedBytecode.immutableReferences || {})
      .flat()
      .map(({ start, length }) => [start, length])
      .sort((a, b) => a[0] - b[0]);
    const text = JSON.stringify({
      compiler: solc.version(),
      source: file,
      abi: compiled.abi,
      bytecode: "0x" + compiled.evm.bytecode.object,
      deployedBytecode: "0x" + compiled.evm.deployedBytecode.object,
      immutables,
    }, null, 1) + "\n";
    const target = path.join(out, `${name}.json`);
    if (check) {
      if (!fs.existsSync(target) || fs.readFileSync(target, "utf8") !== text) stale.push(target);
    } else {
      fs.writeFileSync(target, text);
      console.log(`wrote ${target}`);
    }
  }
}
if (stale.length) {
  console.error(`compiled contracts differ from a fresh compile: ${stale.join(", ")}\nrun: node settlement/evm-tools/compile.mjs (from target/evm-tools)`);
  process.exit(1);
}
