//! The network's model catalog: names every node agrees on, each bound to the model id
//! (`model_header`: a commitment to the GGUF's header and its tensor data) of the one
//! model it names. A catalog name means
//! that model and no other: an advert that offers another file under a catalog name
//! does not validate, and a gateway resolves a catalog name only to its id. A model
//! outside the catalog is addressed by its id.

use crate::ids::ModelId;

/// A catalog model: its name and content id (hex).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogModel {
    pub name: &'static str,
    pub id_hex: &'static str,
}

/// Every catalog model. The engine's catalog fetches these files and checks each
/// against its id (a test keeps the two lists equal).
pub const CATALOG: &[CatalogModel] = &[
    CatalogModel {
        name: "smollm2-135m-instruct",
        id_hex: "56e91e8d496e43a1f0d001a01e27c9f2b2aa26afc2ed61f68f5efa2cfca7aa11",
    },
    CatalogModel {
        name: "gemma3-270m",
        id_hex: "98979f1f78b909cd0d4f15855d16871ad890faeaec562e85ecd4b6a38b3048a0",
    },
];

/// The id a catalog name is bound to (`None` for a name outside the catalog).
pub fn catalog_id(name: &str) -> Option<ModelId> {
    CATALOG
        .iter()
        .find(|m| m.name == name)
        .and_then(|m| m.id_hex.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_name_resolves_to_its_id() {
        for model in CATALOG {
            let id = catalog_id(model.name).expect("a valid id");
            assert_eq!(id.to_string(), model.id_hex);
        }
        assert_eq!(catalog_id("my-own-finetune"), None);
    }
}
