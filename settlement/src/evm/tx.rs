//! EIP-1559 transactions (type 2), encoded and signed here: the one transaction shape the
//! escrow client sends (no value, no access list).

use alloy_primitives::{keccak256, Address, Bytes, B256, U256};
use alloy_rlp::{Encodable, Header, EMPTY_LIST_CODE, EMPTY_STRING_CODE};

use crate::key::AccountKey;

const EIP1559_TYPE: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eip1559Tx {
    pub chain_id: u64,
    pub nonce: u64,
    pub max_priority_fee_per_gas: u128,
    pub max_fee_per_gas: u128,
    pub gas_limit: u64,
    /// `None` deploys `input` as a contract.
    pub to: Option<Address>,
    pub input: Bytes,
}

impl Eip1559Tx {
    fn encode_fields(&self, out: &mut Vec<u8>) {
        self.chain_id.encode(out);
        self.nonce.encode(out);
        self.max_priority_fee_per_gas.encode(out);
        self.max_fee_per_gas.encode(out);
        self.gas_limit.encode(out);
        match &self.to {
            Some(to) => to.encode(out),
            None => out.push(EMPTY_STRING_CODE),
        }
        U256::ZERO.encode(out); // value
        self.input.encode(out);
        out.push(EMPTY_LIST_CODE); // access list
    }

    fn typed(fields: &[u8]) -> Vec<u8> {
        let mut out = vec![EIP1559_TYPE];
        Header {
            list: true,
            payload_length: fields.len(),
        }
        .encode(&mut out);
        out.extend_from_slice(fields);
        out
    }

    /// The hash the sender signs: keccak256(0x02 || rlp(fields)).
    pub fn signing_hash(&self) -> B256 {
        let mut fields = Vec::new();
        self.encode_fields(&mut fields);
        keccak256(Self::typed(&fields))
    }

    /// The signed transaction as `eth_sendRawTransaction` takes it.
    pub fn sign(&self, key: &AccountKey) -> Bytes {
        let signature = key.sign_hash(&self.signing_hash());
        let mut fields = Vec::new();
        self.encode_fields(&mut fields);
        signature.v().encode(&mut fields);
        signature.r().encode(&mut fields);
        signature.s().encode(&mut fields);
        Self::typed(&fields).into()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use alloy_rlp::Decodable;

    #[test]
    fn the_raw_transaction_carries_a_signature_over_its_own_fields() {
        let key = AccountKey::from_bytes(&B256::repeat_byte(9)).unwrap();
        let tx = Eip1559Tx {
            chain_id: 31337,
            nonce: 7,
            max_priority_fee_per_gas: 1_000_000_000,
            max_fee_per_gas: 3_000_000_000,
            gas_limit: 100_000,
            to: Some(Address::repeat_byte(1)),
            input: Bytes::from_static(&[0xde, 0xad]),
        };
        let raw = tx.sign(&key);
        assert_eq!(raw[0], EIP1559_TYPE);
        let mut rest = &raw[1..];
        let header = Header::decode(&mut rest).unwrap();
        assert!(header.list);
        assert_eq!(header.payload_length, rest.len());
        // The signature's last three fields recover the sender over the signing hash.
        let unsigned_len = {
            let mut fields = Vec::new();
            tx.encode_fields(&mut fields);
            fields.len()
        };
        let mut sig = &rest[unsigned_len..];
        let v = bool::decode(&mut sig).unwrap();
        let r = U256::decode(&mut sig).unwrap();
        let s = U256::decode(&mut sig).unwrap();
        let signature = alloy_primitives::Signature::new(r, s, v);
        assert_eq!(
            signature
                .recover_address_from_prehash(&tx.signing_hash())
                .unwrap(),
            key.address()
        );
        // A deployment encodes `to` as the empty string.
        let deploy = Eip1559Tx {
            to: None,
            ..tx.clone()
        };
        assert_ne!(deploy.signing_hash(), tx.signing_hash());
    }
}
